"""The whole lab's status as one object: what `eaglelab.control.status.collect` answers and what the
terminal, the page and /metrics format. `Status` holds each run (`RunStatus`: the host's `Run`, its
`LogState`, the ETA engine's `Estimate`), each stage (`StageStatus`) and the pipeline's estimate.

The JSON (schema 1, docs/interfaces.md) is written once, at the edges (`lab status --json`,
`/api/status`), by `to_json`: the document the object was read from, unchanged, so what a user sees
is exactly what the hosts and the ETA engine said. `from_json` is the one reader: a field of the
wrong type or a record that is no run reads as absent, so front ends format without guards of
their own, and a finish time comes only from the engine's estimate (`Finish`), never from a front end.
Standard library only, like eaglelab.model and eaglelab.logstate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .logstate import Finish, LogState, _iso_time
from .model import RUN_FIELDS, Run, RunState, StageState, _conforms, _hints


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _words(v: Any) -> str | None:
    """A value said in words (the engine's reasons are strings; anything else is shown as it is)."""
    return None if v is None else str(v)


@dataclass(frozen=True)
class Estimate:
    """The ETA engine's estimate for a run, a stage or the pipeline (docs/interfaces.md, "ETA"):
    `finish` (None when it gives no finish time), where it comes from, and what it says with it."""

    finish: Finish | None
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


@dataclass(frozen=True)
class RunStatus:
    """One run of the status: the host's record, its log state read once, the engine's estimate and
    what the status adds (its log stalled, its host unreachable; the page's `log_state_status`)."""

    run: Run
    log: LogState | None = None
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
        return cls(run, LogState.from_json(run.log_state), Estimate.from_json(data.get("eta"), now),
                   shown_stalled or data.get("stalled") is True, data.get("host_unreachable") is True,
                   _str(data.get("log_state_status")))

    @property
    def progress(self):
        """The main bar of its log (logstate.Progress), or None."""
        return self.log.progress if self.log else None


@dataclass(frozen=True)
class StageStatus:
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
        state, deps = data.get("state"), data.get("depends_on")
        return cls(str(data.get("name")), str(data.get("host")),
                   StageState(state) if isinstance(state, str) and state in StageState._value2member_map_ else None,
                   _str(data.get("kind")), _str(data.get("latest_run")),
                   tuple(str(d) for d in deps) if isinstance(deps, list) else (),
                   Estimate.from_json(data.get("eta"), now))


@dataclass(frozen=True)
class Status:
    """The lab: runs, stages, hosts and the pipeline's estimate, read from the schema-1 JSON once.
    `hosts` and the pipeline's other blocks (forecast, side jobs, services, outcome) stay JSON objects:
    the page formats them through their own readers (status_web/model.py)."""

    runs: tuple[RunStatus, ...]
    stages: tuple[StageStatus, ...]
    hosts: tuple[dict, ...]
    pipeline: Estimate | None
    now: float  # the time the relative encodings (eta_s) were read against
    json: dict = field(repr=False, compare=False)  # the document, as collect made it (to_json's answer)

    @classmethod
    def from_json(cls, data: Any, now: float) -> Status:
        """Any JSON value: what is not a status reads as an empty one."""
        data = data if isinstance(data, dict) else {}

        def each(key: str) -> list:
            v = data.get(key)
            return v if isinstance(v, list) else []
        runs = tuple(r for r in (RunStatus.from_json(d, now) for d in each("runs")) if r is not None)
        stages = tuple(s for s in (StageStatus.from_json(d, now) for d in each("stages")) if s is not None)
        return cls(runs, stages, tuple(h for h in each("hosts") if isinstance(h, dict)),
                   Estimate.from_json(data.get("pipeline"), now), now, data)

    def to_json(self) -> dict:
        """The schema-1 document (a shallow copy: an edge adds its own keys, as /api/status does)."""
        return dict(self.json)

    def run(self, run_id: str | None) -> RunStatus | None:
        return self._by_id.get(run_id) if run_id else None

    @property
    def _by_id(self) -> dict[str, RunStatus]:
        cached = self.__dict__.get("_by_id_cache")
        if cached is None:
            cached = {r.run.id: r for r in self.runs}
            object.__setattr__(self, "_by_id_cache", cached)
        return cached

    def block(self, key: str) -> dict:
        """A top-level JSON object of the document (pipeline, outcome, config), {} when absent."""
        v = self.json.get(key)
        return v if isinstance(v, dict) else {}
