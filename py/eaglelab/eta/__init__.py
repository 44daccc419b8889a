"""ETAs, by layer: `estimator` (a bar's time left: the maths and the one driver, `bar_eta`),
`history` (what earlier runs of a stage took, phase by phase), `schedule` (a run's phases, the
stages through the `depends_on` DAG, `annotate` for `lab status --json`), `replay` (a log's bars
re-estimated frame by frame, as if tailed live: `lab eta replay`, the benchmarks).
Pure: no I/O, the clock is passed in.

The estimator's names are imported on first use (PEP 562): it needs numpy, ~0.1 s of CPU to
import, which `annotate` (every `lab status`) never uses: it reads the tailer's estimate."""

from __future__ import annotations

import importlib

from .history import History, PhaseRecord, RunRecord, Span, phase_estimate, phase_template, run_duration_estimate
from .schedule import annotate, pipeline_finish, run_eta

_ESTIMATOR = ("CONCURRENT_BARS", "BarEstimate", "BarTracker", "TqdmEma", "bar_eta", "estimate_bar")

__all__ = ["CONCURRENT_BARS", "BarEstimate", "BarTracker", "History", "PhaseRecord", "RunRecord", "Span", "TqdmEma",
           "annotate", "bar_eta", "estimate_bar", "phase_estimate", "phase_template", "pipeline_finish", "run_eta",
           "run_duration_estimate"]


def __getattr__(name: str):
    if name in _ESTIMATOR:
        return getattr(importlib.import_module("eaglelab.eta.estimator"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
