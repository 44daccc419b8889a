"""ETAs, by layer: `estimator` (a bar's time left: the maths and the one driver, `bar_eta`),
`history` (what earlier runs of a stage took, phase by phase), `schedule` (a run's phases, the
stages through the `depends_on` DAG, `annotate` for `lab status --json`), `replay` (a log's bars
re-estimated frame by frame, as if tailed live: `lab eta replay`, the benchmarks).
Pure: no I/O, the clock is passed in."""

from .estimator import CONCURRENT_BARS, BarEstimate, BarTracker, TqdmEma, bar_eta, estimate_bar
from .history import History, PhaseRecord, RunRecord, Span, phase_estimate, phase_template, run_duration_estimate
from .schedule import annotate, pipeline_finish, run_eta

__all__ = ["CONCURRENT_BARS", "BarEstimate", "BarTracker", "History", "PhaseRecord", "RunRecord", "Span", "TqdmEma",
           "annotate", "bar_eta", "estimate_bar", "phase_estimate", "phase_template", "pipeline_finish", "run_eta",
           "run_duration_estimate"]
