"""First-run estimates: a stage that never ran here lasts its input's size x a declared throughput
(the `prior:` of its config), with a wide range; once this lab has finished runs of it (same host
and profile) with a recorded size, their measured seconds per unit replace the declared throughput
and the range narrows with every run (docs/interfaces.md, "ETA"). Pure: sizes are measured on the
hosts by the caller (eaglelab.host.sizes) and passed in."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .history import History, Span, run_duration_estimate


@dataclass(frozen=True)
class Prior:
    """A stage's declared throughput and the size of its input now (None: not measurable)."""

    unit: str
    per_s: float  # declared units per second
    units: float | None  # input size x passes; None when it could not be measured nor assumed
    fixed_s: float = 0.0
    spread: float = 3.0
    size_how: str = ""  # how the size was found ("lines of prompts.jsonl", "prior.limit 64 ...")
    reason: str | None = None  # why there is no size (units None), or why a fallback was used

    @classmethod
    def from_dict(cls, d: dict) -> Prior:
        units = d.get("units")
        return cls(unit=str(d["unit"]), per_s=float(d["per_s"]), units=None if units is None else float(units),
                   fixed_s=float(d.get("fixed_s") or 0.0), spread=float(d.get("spread") or 3.0),
                   size_how=str(d.get("size_how") or ""), reason=d.get("reason"))


def _n(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _rate(units_per_s: float, unit: str) -> str:
    return f"{_n(units_per_s)} {unit}/s" if units_per_s >= 1 else f"{_n(1 / units_per_s)} s per {unit.rstrip('s')}"


def _fixed(p: Prior) -> str:
    return f" + {p.fixed_s:.0f} s fixed" if p.fixed_s else ""


def prior_span(p: Prior) -> Span | None:
    """size / declared throughput (+ fixed time), range /spread .. x spread."""
    if p.units is None:
        return None
    eta = p.fixed_s + p.units / p.per_s
    basis = f"prior: {_n(p.units)} {p.unit} at {_rate(p.per_s, p.unit)}{_fixed(p)} ({p.size_how})"
    return Span(eta, eta / p.spread, eta * p.spread, "prior", basis=basis)


def learned_span(history: History, stage: str, host: str, profile: str, p: Prior) -> Span | None:
    """The same stage's finished runs here (host + profile) whose size was recorded: their seconds
    per unit (beyond the fixed time) x today's size; the range is theirs widened by spread**(1/(n+1))."""
    if p.units is None:
        return None
    runs = [r for r in history.same(stage, host, profile) if (history.units.get(r.run_id or "") or 0) > 0]
    if not runs:
        return None
    # a run shorter than the declared fixed time still says something: at least 10% of it scales
    per_unit = [max(r.duration_s - p.fixed_s, 0.1 * r.duration_s) / history.units[r.run_id or ""] for r in runs]
    fixed = [r.duration_s - x * history.units[r.run_id or ""] for r, x in zip(runs, per_unit)]
    preds = [f + x * p.units for f, x in zip(fixed, per_unit)]
    widen = p.spread ** (1.0 / (len(runs) + 1))
    eta = statistics.median(fixed) + statistics.median(per_unit) * p.units
    n = len(runs)
    basis = (f"learned from {n} run{'s' if n > 1 else ''}: {_n(p.units)} {p.unit} at "
             f"{_rate(1 / statistics.median(per_unit), p.unit)}{_fixed(p)} ({p.size_how})")
    return Span(eta, min(preds) / widen, max(preds) * widen, "learned", basis=basis)


def stage_estimate(history: History, stage: str, host: str, profile: str,
                   prior: Prior | None, service: bool = False) -> tuple[Span | None, str | None]:
    """How long a run of the stage that has not started will take, and why there is none when
    none: learned rate x size; else earlier runs here (no size recorded); else the declared prior
    x size; else the same stage elsewhere. A service's earlier runs lasted as long as it was
    needed, not until it was ready (what the pipeline waits for): its prior comes first."""
    if service and prior is not None and (declared := prior_span(prior)) is not None:
        return declared, None
    learned = learned_span(history, stage, host, profile, prior) if prior else None
    if learned is not None:
        return learned, None
    dur = run_duration_estimate(history, stage, host, profile)
    if dur is not None and dur.source == "history":
        return dur, None
    declared = prior_span(prior) if prior else None
    if declared is not None:
        return declared, None
    if dur is not None:
        return dur, None
    if prior is not None:
        return None, f"no estimate: {prior.reason or 'the input size is unknown'}"
    return None, "no estimate: no earlier run and no prior: declared for this stage"
