"""What a run's log state says, read once for the front ends: the state JSON (`LogState`), its main
bar (`Progress`), and when something will finish as the ETA engine estimated it (`Finish`).

Frozen standard-library objects with from_json/to_json (docs/interfaces.md), beside eaglelab.model's
`Run`: a field of the wrong type reads as absent here, so the page and the terminal format them
without guards of their own, and never estimate a finish time again. A module of its own so that
`lab status`, which only passes these JSON objects on, does not pay for making the classes.
"""

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any


def _number(v: Any) -> float | None:
    """A finite number of a JSON object, or None (bools, strings, NaN and infinities are not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


@dataclass(frozen=True)
class Progress:
    """The state JSON's `progress`: the stage's main bar (docs/interfaces.md). from_json is the one
    place its fields are checked: a garbled one reads as absent, never as a crash in a front end."""

    n: float
    total: float | None = None
    unit: str = "it"
    label: str = ""
    rate_s_per_it: float | None = None
    elapsed_s: float | None = None
    eta_s: float | None = None
    eta_low_s: float | None = None
    eta_high_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> "Progress | None":
        """None when there is no bar (not an object, or no count `n`)."""
        if not isinstance(data, dict) or _number(data.get("n")) is None:
            return None
        nums = {k: _number(data.get(k)) for k in ("total", "rate_s_per_it", "elapsed_s", "eta_s", "eta_low_s",
                                                   "eta_high_s")}
        return cls(n=_number(data["n"]), unit=str(data.get("unit") or "it"), label=str(data.get("label") or ""),
                   **nums, extra={k: v for k, v in data.items() if k not in _PROGRESS_FIELDS})

    def to_json(self) -> dict:
        return {**{k: getattr(self, k) for k in _PROGRESS_FIELDS}, **self.extra}

    @cached_property
    def history(self) -> tuple[tuple[float, float], ...]:
        """The bar's (elapsed_s, n) samples, in order (`history`: pairs, or objects of an older
        parser); a garbled sample is dropped. Read when asked: `lab status` never needs it."""
        raw = self.extra.get("history")
        out = []
        for item in raw if isinstance(raw, list) else []:
            if isinstance(item, dict):
                e, n = _number(item.get("elapsed_s")), _number(item.get("n"))
            elif isinstance(item, (list, tuple)) and len(item) >= 2:
                e, n = _number(item[0]), _number(item[1])
            else:
                continue
            if e is not None and n is not None:
                out.append((e, n))
        return tuple(out)


_PROGRESS_FIELDS = ("n", "total", "unit", "label", "rate_s_per_it", "elapsed_s", "eta_s", "eta_low_s", "eta_high_s")


@dataclass(frozen=True)
class LogState:
    """The state JSON (docs/interfaces.md), as the parser wrote it and settle made it agree with the
    run: `state` (a RunState, or `stalled`), `failure`, the main `progress`, the open `phase`."""

    state: str | None = None
    failure: dict[str, Any] | None = None
    progress: Progress | None = None
    phase: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> "LogState | None":
        """None when there is no state JSON (absent, or not an object)."""
        if not isinstance(data, dict):
            return None
        state, failure, phase = data.get("state"), data.get("failure"), data.get("phase")
        return cls(state=state if isinstance(state, str) else None,
                   failure=failure if isinstance(failure, dict) else None,
                   progress=Progress.from_json(data.get("progress")), phase=phase if isinstance(phase, str) else None,
                   extra={k: v for k, v in data.items() if k not in ("state", "failure", "progress", "phase")})

    def to_json(self) -> dict:
        return {"state": self.state, "failure": self.failure,
                "progress": self.progress.to_json() if self.progress else None, "phase": self.phase, **self.extra}

    # The state JSON's bigger parts, read when a page asks for them (`lab status` never does).

    @cached_property
    def phases(self) -> tuple["Phase", ...]:
        """The phases seen, in order; an entry that is not an object is dropped."""
        raw = self.extra.get("phases")
        return tuple(Phase.from_json(p) for p in (raw if isinstance(raw, list) else []) if isinstance(p, dict))

    @cached_property
    def metrics(self) -> dict[str, tuple[tuple[float, float], ...]]:
        """Each metric's (step, value) points, by name; a garbled point is dropped, a series left
        without points is absent."""
        raw = self.extra.get("metrics")
        out = {}
        for name, series in (raw.items() if isinstance(raw, dict) else ()):
            pts = tuple((_number(i[0]), _number(i[1])) for i in (series if isinstance(series, list) else [])
                        if isinstance(i, (list, tuple)) and len(i) >= 2
                        and _number(i[0]) is not None and _number(i[1]) is not None)
            if pts:
                out[str(name)] = pts
        return out

    def last(self, metric: str) -> float | None:
        """A metric's latest value, or None."""
        pts = self.metrics.get(metric)
        return pts[-1][1] if pts else None

    @property
    def ready(self) -> bool:
        """A service's log said it is ready (serving)."""
        return bool(self.extra.get("ready"))

    @property
    def stall_message(self) -> str:
        """Why the tailer calls the run stalled (its `stall` diagnosis), "" when it says nothing."""
        stall = self.extra.get("stall")
        return str(stall.get("message") or "") if isinstance(stall, dict) else ""


@dataclass(frozen=True)
class Phase:
    """One phase of the state JSON's `phases`: its name, how long it took, the lines it spans."""

    name: str
    duration_s: float | None = None
    started_line: Any = None
    ended_line: Any = None

    @classmethod
    def from_json(cls, data: dict) -> "Phase":
        return cls(str(data.get("name") or "?"), _number(data.get("duration_s")), data.get("started_line"),
                   data.get("ended_line"))


@dataclass(frozen=True)
class Finish:
    """When something will finish, as the ETA engine estimated it: `at` (a POSIX time), the range
    `low`..`high` (None when it gives none), and the estimate's `source`. The one reader of the two
    encodings in the JSON (finish_at/finish_low_at/finish_high_at as ISO times, or eta_s/eta_low_s/
    eta_high_s from `now`); front ends format it, never estimate again."""

    at: float
    low: float | None = None
    high: float | None = None
    source: str | None = None

    @classmethod
    def from_json(cls, eta: Any, now: float) -> "Finish | None":
        """None when eta says nothing usable (absent, garbled, no finish time)."""
        if not isinstance(eta, dict):
            return None

        def when(iso_key: str, rel_key: str) -> float | None:
            t = _iso_time(eta.get(iso_key))
            rel = _number(eta.get(rel_key))
            return now + rel if t is None and rel is not None else t

        at = when("finish_at", "eta_s")
        if at is None:
            return None
        source = eta.get("source")
        return cls(at, when("finish_low_at", "eta_low_s"), when("finish_high_at", "eta_high_s"),
                   source if isinstance(source, str) else None)

    def to_json(self) -> dict:
        return {"finish_at": _iso(self.at), "finish_low_at": _iso(self.low), "finish_high_at": _iso(self.high),
                "source": self.source}


def _iso_time(v: Any) -> float | None:
    """An ISO time of our JSON as a POSIX time; None when absent or garbled."""
    if not isinstance(v, str):
        return None
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
