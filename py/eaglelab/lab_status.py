"""The whole lab's status as one object: what `eaglelab.control.status.collect` answers and what the
terminal, the page and /metrics format. `Status` holds each run (`RunStatus`: the host's `Run`, its
`LogState`, the ETA engine's `Estimate`), each stage (`StageStatus`) and the pipeline's estimate.

The JSON (schema 1, docs/interfaces.md) is written once, at the edges (`lab status --json`,
`/api/status`), by `to_json`: the document the object was read from, unchanged, so what a user sees
is exactly what the hosts and the ETA engine said. `from_json` is the one reader: a field of the
wrong type or a record that is no run reads as absent, so front ends format without guards of
their own, and a finish time comes only from the engine's estimate (`Finish`), never from a front end.

Cheap on purpose (issue 31, item 7: `lab status --json` within 0.3 s of CPU): the parts are read
when a front end first asks for them (`lab status --json` never does), and they are NamedTuples —
immutable like frozen dataclasses, made ~10x faster at import. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from .model import RUN_FIELDS, Run, RunState, StageState, _conforms, _hints

# eaglelab.logstate (LogState, Finish) is imported where a part is first read, not here: making its
# classes costs ~6 ms, which `lab status --json` (it only writes the document) would pay for nothing.


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _words(v: Any) -> str | None:
    """A value said in words (the engine's reasons are strings; anything else is shown as it is)."""
    return None if v is None else str(v)


class Estimate(NamedTuple):
    """The ETA engine's estimate for a run, a stage or the pipeline (docs/interfaces.md, "ETA"):
    `finish` (a logstate.Finish; None when it gives no finish time), where it comes from, and what
    it says with it."""

    finish: Any  # logstate.Finish | None
    source: str | None = None         # progress, history, prior, learned, ... ; stalled, unknown
    reason: str | None = None         # why there is no finish time (stalled, no estimate)
    basis: str | None = None          # what it rests on, in words ("prior: ...", "learned from 2 runs")
    start_at: float | None = None     # a stage still to run: when it would start
    assumes_rerun: bool = False       # an ended stage that reruns because a stage before it does
    critical_path: tuple[str, ...] = ()  # the pipeline's: the chain of stages that decides its finish

    @property
    def stalled(self) -> bool:
        """A bar quiet past its estimate's slow end: no finish time, and the reason says why."""
        return self.source == StageState.STALLED

    @classmethod
    def from_json(cls, eta: Any, now: float) -> Estimate | None:
        """None when there is no estimate at all (absent, not an object)."""
        if not isinstance(eta, dict):
            return None
        from .logstate import Finish, _iso_time  # see the note at the top
        path = eta.get("critical_path")
        return cls(Finish.from_json(eta, now), _str(eta.get("source")), _words(eta.get("reason")),
                   _str(eta.get("basis")), _iso_time(eta.get("start_at")), eta.get("assumes_rerun") is True,
                   tuple(str(s) for s in path) if isinstance(path, list) else ())


def read_run(data: Any) -> Run | None:
    """A run record as the front ends take it: a field of the wrong type reads as absent (its
    default; "" for a missing id, stage or host); None when it is no run (not an object, or no
    known state)."""
    if not isinstance(data, dict):
        return None
    state = data.get("state")
    if not isinstance(state, str) or state not in RunState._value2member_map_:
        return None
    hints = _hints(Run)
    known = {k: data[k] for k in RUN_FIELDS if k in data and _conforms(data[k], hints[k])}
    for k in ("id", "stage", "host"):
        known.setdefault(k, "")
    known["state"] = RunState(state)
    return Run(**known, extra={k: v for k, v in data.items() if k not in _RUN_KEYS})


_RUN_KEYS = frozenset(RUN_FIELDS)


class RunStatus(NamedTuple):
    """One run of the status: the host's record, its log state read once (a logstate.LogState), the
    engine's estimate and what the status adds (its log stalled, its host unreachable; the page's
    `log_state_status`)."""

    run: Run
    log: Any = None  # logstate.LogState | None
    eta: Estimate | None = None
    stalled: bool = False
    host_unreachable: bool = False
    log_state_status: str | None = None  # the page's: ok, missing, unreadable, not_json_object (or None)

    @classmethod
    def from_json(cls, data: Any, now: float) -> RunStatus | None:
        shown_stalled = isinstance(data, dict) and data.get("state") == StageState.STALLED
        if shown_stalled:  # a record that carries the display state: running, its log stalled
            data = {**data, "state": RunState.RUNNING}
        run = read_run(data)
        if run is None:
            return None
        from .logstate import LogState  # see the note at the top
        return cls(run, LogState.from_json(run.log_state), Estimate.from_json(data.get("eta"), now),
                   shown_stalled or data.get("stalled") is True, data.get("host_unreachable") is True,
                   _str(data.get("log_state_status")))

    @property
    def progress(self):
        """The main bar of its log (logstate.Progress), or None."""
        return self.log.progress if self.log else None

    @property
    def preflight(self) -> tuple:
        """Its preflight results (run_details.PreflightCheck), from the record or its log state."""
        from .run_details import PreflightCheck  # read on first use: see the note at the top
        raw = self.run.extra.get("preflight") or (self.log.extra.get("preflight") if self.log else None)
        return PreflightCheck.all_from_json(raw)

    @property
    def slurm(self):
        """Its place in a Slurm queue (run_details.SlurmJob), None on another kind of host."""
        from .run_details import SlurmJob  # read on first use: see the note at the top
        return SlurmJob.from_json(self.run.slurm)


class StageStatus(NamedTuple):
    """One stage of the pipeline as the status shows it: its display state (None when the record's
    is none of StageState's), its latest run's id and the engine's estimate for it."""

    name: str
    host: str
    state: StageState | None
    kind: str | None = None
    latest_run: str | None = None
    depends_on: tuple[str, ...] = ()
    eta: Estimate | None = None

    @classmethod
    def from_json(cls, data: Any, now: float) -> StageStatus | None:
        if not isinstance(data, dict):
            return None
        state, deps = data.get("state") or StageState.PENDING, data.get("depends_on")
        return cls(str(data.get("name")), str(data.get("host")),
                   StageState(state) if isinstance(state, str) and state in StageState._value2member_map_ else None,
                   _str(data.get("kind")), _str(data.get("latest_run")),
                   tuple(str(d) for d in deps) if isinstance(deps, list) else (),
                   Estimate.from_json(data.get("eta"), now))


@dataclass(frozen=True)
class Status:
    """The lab: runs, stages, hosts and the pipeline's estimate, read from the schema-1 document
    when first asked for, each part typed: hosts (host_status), the forecast, side jobs, outcome and
    configuration notice (pipeline_status), a run's preflight and Slurm place (run_details)."""

    json: dict = field(repr=False)  # the document, as collect made it (to_json's answer)
    now: float = 0.0  # the time the relative encodings (eta_s) are read against

    @classmethod
    def from_json(cls, data: Any, now: float) -> Status:
        """Any JSON value: what is not a status reads as an empty one."""
        return cls(data if isinstance(data, dict) else {}, now)

    def to_json(self) -> dict:
        """The schema-1 document (a shallow copy: an edge adds its own keys, as /api/status does)."""
        return dict(self.json)

    def _each(self, key: str) -> list:
        v = self.json.get(key)
        return v if isinstance(v, list) else []

    @cached_property
    def runs(self) -> tuple[RunStatus, ...]:
        return tuple(r for r in (RunStatus.from_json(d, self.now) for d in self._each("runs")) if r is not None)

    @cached_property
    def stages(self) -> tuple[StageStatus, ...]:
        return tuple(s for s in (StageStatus.from_json(d, self.now) for d in self._each("stages")) if s is not None)

    @cached_property
    def hosts(self) -> tuple:
        """Each host (host_status.HostStatus)."""
        from .host_status import HostStatus  # read on first use: see the note at the top
        return tuple(h for h in map(HostStatus.from_json, self._each("hosts")) if h is not None)

    def host(self, name: str | None):
        """A host by name (host_status.HostStatus), or None."""
        return next((h for h in self.hosts if h.name == name), None)

    # The pipeline's other blocks (pipeline_status), each read once when a page first asks.

    @cached_property
    def forecast(self):
        """pipeline.forecast (pipeline_status.Forecast), None before any evidence."""
        from .pipeline_status import Forecast  # read on first use: see the note at the top
        return Forecast.from_json(self.block("pipeline").get("forecast"))

    @cached_property
    def forecast_history(self) -> tuple:
        """pipeline.forecast_history: past forecasts against the eval (pipeline_status.ForecastCheck)."""
        from .pipeline_status import ForecastCheck  # read on first use: see the note at the top
        rows = self.block("pipeline").get("forecast_history")
        return tuple(h for h in map(ForecastCheck.from_json, rows if isinstance(rows, list) else []) if h is not None)

    @cached_property
    def side_jobs(self) -> tuple:
        """pipeline.side_jobs (pipeline_status.SideJob)."""
        from .pipeline_status import SideJob  # read on first use: see the note at the top
        rows = self.block("pipeline").get("side_jobs")
        return tuple(j for j in map(SideJob.from_json, rows if isinstance(rows, list) else []) if j is not None)

    @cached_property
    def outcome(self):
        """The page's outcome block (pipeline_status.Outcome), None when the status has none."""
        from .pipeline_status import Outcome  # read on first use: see the note at the top
        return Outcome.from_json(self.json["outcome"]) if self.json.get("outcome") is not None else None

    @cached_property
    def config(self):
        """The page's configuration notice (pipeline_status.ConfigNote), None without one."""
        from .pipeline_status import ConfigNote  # read on first use: see the note at the top
        return ConfigNote.from_json(self.json.get("config"))

    @cached_property
    def pipeline(self) -> Estimate | None:
        return Estimate.from_json(self.json.get("pipeline"), self.now)

    @cached_property
    def _by_id(self) -> dict[str, RunStatus]:
        return {r.run.id: r for r in self.runs}

    def run(self, run_id: str | None) -> RunStatus | None:
        return self._by_id.get(run_id) if run_id else None

    def block(self, key: str) -> dict:
        """A top-level JSON object of the document (pipeline, outcome, config), {} when absent."""
        v = self.json.get(key)
        return v if isinstance(v, dict) else {}
