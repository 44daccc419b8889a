"""Durations of earlier runs, phase by phase, as ranges (`Span`): what a phase or a stage that has
no progress bar (yet) will take, from this lab's registry (docs/interfaces.md, "## ETA")."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from eaglelab.errors import RegistryError
from eaglelab.model import RunState

WHOLE_RUN = "__run__"  # the registry's phase row for a run whose log named no phases

@dataclass(frozen=True)
class PhaseRecord:
    """One finished phase of an earlier run."""

    name: str
    duration_s: float
    items: float | None = None  # what the phase's bar counted (shards, samples, steps), if it had one
    s_per_item: float | None = None  # duration_s / items where the phase had a bar


@dataclass(frozen=True)
class RunRecord:
    """One finished run of a stage: where, with which profile, and its phases in order."""

    stage: str
    host: str
    profile: str
    duration_s: float
    phases: tuple[PhaseRecord, ...] = ()
    state: str = "completed"
    run_id: str | None = None
    ended_at: str | None = None


@dataclass(frozen=True)
class History:
    """Earlier runs, plus expected sizes of phases (for phases with no history on this host/profile)."""

    runs: tuple[RunRecord, ...] = ()
    # {stage: {phase: items expected in this profile}}, e.g. {"extract": {"extraction": 10000}}
    expected_items: dict = field(default_factory=dict)
    # {run_id: the input's size in its prior's unit (x passes)}: what first-run priors learn from
    units: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict | None) -> History:
        """The plain JSON shape (docs/interfaces.md, "## ETA") -> History. Unknown keys are ignored."""
        if not d:
            return cls()
        runs = []
        for i, r in enumerate(d.get("runs", [])):
            where = f"ETA history runs[{i}]"
            try:
                phases = tuple(PhaseRecord(name=str(p["name"]), duration_s=float(p["duration_s"]),
                                           items=_opt_float(p.get("items")), s_per_item=_opt_float(p.get("s_per_item")))
                               for p in r.get("phases") or [] if p.get("duration_s") is not None)
                dur = r.get("duration_s")
                dur = sum(p.duration_s for p in phases) if dur is None else float(dur)
                runs.append(RunRecord(stage=str(r["stage"]), host=str(r.get("host", "")),
                                      profile=str(r.get("profile", "")), duration_s=dur, phases=phases,
                                      state=str(r.get("state", "completed")),
                                      run_id=r.get("run_id") or r.get("id"), ended_at=r.get("ended_at")))
            except KeyError as e:
                raise RegistryError(f"{where}: missing key {e.args[0]!r}; each run needs `stage` and each "
                                    f"phase `name` and `duration_s` (docs/interfaces.md, ETA)") from None
            except (TypeError, ValueError, AttributeError) as e:
                raise RegistryError(f"{where}: {e}; durations are seconds (numbers), phases a list of "
                                    f"objects (docs/interfaces.md, ETA)") from None
        runs.extend(_runs_from_phase_rows(d.get("phases") or []))
        return cls(runs=tuple(runs), expected_items=dict(d.get("expected_items") or {}),
                   units=_units(d.get("units") or []))

    def with_status_runs(self, status: dict) -> History:
        """Plus the finished runs the status itself lists (their phases from their log state), so an
        ETA has history even where the registry kept no phase rows; a run already known is skipped."""
        known = {r.run_id for r in self.runs if r.run_id}
        extra = []
        for r in status.get("runs", []):
            if r.get("state") != RunState.COMPLETED or r.get("id") in known or r.get("duration_s") is None:
                continue
            ls = r.get("log_state") or {}
            phases = tuple(PhaseRecord(str(p.get("name")), float(p["duration_s"]))
                           for p in ls.get("phases") or [] if p.get("duration_s") is not None)
            extra.append(RunRecord(stage=str(r.get("stage")), host=str(r.get("host")),
                                   profile=str(r.get("profile") or status.get("profile") or ""),
                                   duration_s=float(r["duration_s"]), phases=phases, run_id=r.get("id"),
                                   ended_at=r.get("ended_at")))
        return History(runs=self.runs + tuple(extra), expected_items=self.expected_items, units=self.units)

    def same(self, stage: str, host: str, profile: str) -> list[RunRecord]:
        """Completed runs of this stage on this host with this profile, oldest first."""
        return [r for r in self.runs if r.stage == stage and r.host == host and r.profile == profile
                and r.state == RunState.COMPLETED]

    def other(self, stage: str) -> list[RunRecord]:
        return [r for r in self.runs if r.stage == stage and r.state == RunState.COMPLETED]


@dataclass(frozen=True)
class Span:
    """A duration estimate with its range (seconds) and where it came from."""

    eta_s: float
    low_s: float
    high_s: float
    source: str  # progress | history | size | other_host | prior | learned | elapsed | none
    basis: str = ""  # in words, for a person: "prior: 64 samples at 2 samples/s (lines of ...)"

    def __add__(self, other: Span) -> Span:
        src = self.source if self.source == other.source else "mixed"
        basis = self.basis if self.basis == other.basis else ""
        return Span(self.eta_s + other.eta_s, self.low_s + other.low_s, self.high_s + other.high_s, src, basis)


ZERO = Span(0.0, 0.0, 0.0, "done")
HISTORY_WIDEN = 0.15  # phase durations from history: the range is [min, max] of earlier runs, +-15%
OTHER_WIDEN = 1.0  # from another host/profile: x0.5 .. x2


def _runs_from_phase_rows(rows: list[dict]) -> list[RunRecord]:
    """The registry's flat phase rows ({run_id, stage, host, profile, phase, duration_s, items,
    rate_s_per_item, ended_at}, oldest first) grouped into runs, phases in the order they ended."""
    by_run: dict[str, list[dict]] = {}
    for i, row in enumerate(rows):
        for key in ("run_id", "stage", "phase"):
            if row.get(key) is None:
                raise RegistryError(f"ETA history phases[{i}]: missing key {key!r}; each phase row needs "
                                    f"run_id, stage, phase and duration_s (docs/interfaces.md, ETA)")
        by_run.setdefault(str(row["run_id"]), []).append(row)
    out = []
    for run_id, prows in by_run.items():
        try:
            phases = tuple(PhaseRecord(str(p["phase"]), float(p["duration_s"]), _opt_float(p.get("items")),
                                       _opt_float(p.get("rate_s_per_item", p.get("s_per_item"))))
                           for p in prows if p.get("duration_s") is not None and p["phase"] != WHOLE_RUN)
            whole = [float(p["duration_s"]) for p in prows if p["phase"] == WHOLE_RUN and p.get("duration_s") is not None]
        except (TypeError, ValueError) as e:
            raise RegistryError(f"ETA history phases of run {run_id}: {e}; duration_s, items and "
                                f"rate_s_per_item are numbers (docs/interfaces.md, ETA)") from None
        first = prows[0]
        # `__run__` is the whole run (it includes time outside every phase), not one more phase.
        duration = whole[-1] if whole else sum(p.duration_s for p in phases)
        out.append(RunRecord(stage=str(first["stage"]), host=str(first.get("host") or ""),
                             profile=str(first.get("profile") or ""), duration_s=duration,
                             phases=phases, run_id=run_id, ended_at=prows[-1].get("ended_at")))
    return out


def _units(rows: list[dict]) -> dict[str, float]:
    """The registry's run_units rows ({run_id, units, ...}) -> {run_id: units}."""
    out = {}
    for i, row in enumerate(rows):
        try:
            out[str(row["run_id"])] = float(row["units"])
        except KeyError as e:
            raise RegistryError(f"ETA history units[{i}]: missing key {e.args[0]!r}; each row needs run_id "
                                f"and units (docs/interfaces.md, ETA)") from None
        except (TypeError, ValueError) as e:
            raise RegistryError(f"ETA history units[{i}]: {e}; units is a number (docs/interfaces.md, ETA)") from None
    return out


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _from_durations(durations: list[float], source: str, widen: float) -> Span:
    med = statistics.median(durations)
    return Span(med, min(durations) / (1 + widen), max(durations) * (1 + widen), source)


def phase_estimate(history: History, stage: str, host: str, profile: str, phase: str) -> Span | None:
    """How long a phase that has not begun will take: same stage+host+profile history, else the
    expected size times a rate measured elsewhere, else the same phase elsewhere (wide range).
    WHOLE_RUN: the whole run of a stage whose runs name no phases."""
    if phase == WHOLE_RUN:
        same = [r.duration_s for r in history.same(stage, host, profile)]
        if same:
            return _from_durations(same, "history", HISTORY_WIDEN)
        other = [r.duration_s for r in history.other(stage)]
        return _from_durations(other, "other_host", OTHER_WIDEN) if other else None
    same = [p.duration_s for r in history.same(stage, host, profile) for p in r.phases if p.name == phase]
    if same:
        return _from_durations(same, "history", HISTORY_WIDEN)
    others = [p for r in history.other(stage) for p in r.phases if p.name == phase]
    items = (history.expected_items.get(stage) or {}).get(phase)
    rates = [p.s_per_item for p in others if p.s_per_item]
    if items and rates:
        return _from_durations([items * r for r in rates], "size", OTHER_WIDEN)
    if others:
        return _from_durations([p.duration_s for p in others], "other_host", OTHER_WIDEN)
    return None


def phase_template(history: History, stage: str, host: str, profile: str) -> list[str]:
    """The phases a run of this stage goes through, from its latest earlier run (same place first)."""
    for runs in (history.same(stage, host, profile), history.other(stage)):
        for r in reversed(runs):
            if r.phases:
                return [p.name for p in r.phases]
    return [WHOLE_RUN] if history.other(stage) else []  # runs known, phases not: the run is one phase


def run_duration_estimate(history: History, stage: str, host: str, profile: str) -> Span | None:
    """A whole run of a stage that has not started: the sum of its phases' estimates, or whole-run
    durations of earlier runs where the phases are not known."""
    names = phase_template(history, stage, host, profile)
    spans = [phase_estimate(history, stage, host, profile, p) for p in names]
    if names and all(s is not None for s in spans):
        total = spans[0]
        for s in spans[1:]:
            total = total + s
        return total
    same = [r.duration_s for r in history.same(stage, host, profile)]
    if same:
        return _from_durations(same, "history", HISTORY_WIDEN)
    other = [r.duration_s for r in history.other(stage)]
    if other:
        return _from_durations(other, "other_host", OTHER_WIDEN)
    return None
