"""Gates: a stage runs only while the pipeline's forecast says the drafter can still pay off.

conf/pipeline.yaml (or a profile) puts a gate on a stage:

    gates:
      train: {min_acceptance_rate: 0.2, min_checkpoints: 2}   # stop a drafter that is not learning
      eval:  {max_disagreement: 0.15}

A gate is checked before its stage starts and, while the stage runs, every few seconds of the
controller's wait. A failing gate stops the stage (or keeps it from starting), which stops the
pipeline there, says why, and sends the `gate_failed` notification. `--ignore-gates` overrides.
A condition without its evidence passes: no speedup is judged before one is measured, and an
offline forecast counts only after min_checkpoints estimates (the first checkpoints know little).
"""

from __future__ import annotations

import time
from typing import TextIO

from eaglelab.fsutil import utcnow_iso
from eaglelab.model import StageState

from . import forecast

CHECK_EVERY_S = 5.0


def reasons(gate, fc: dict | None) -> list[str]:
    """Why the forecast fails the gate ([] = it passes); pure."""
    if not fc or "acceptance_rate" not in fc:
        return []
    out = []
    offline = fc.get("source") in ("pilot", "checkpoint")
    enough = not offline or (fc.get("checkpoints") or 0) >= gate.min_checkpoints
    where = f"{fc['source']} forecast" + (f" after {fc.get('checkpoints')} checkpoint(s)" if offline else "")
    if enough and gate.min_acceptance_rate is not None and fc["acceptance_rate"] < gate.min_acceptance_rate:
        out.append(f"{where}: acceptance rate {fc['acceptance_rate']:.1%} < min_acceptance_rate "
                   f"{gate.min_acceptance_rate:.1%}")
    if enough and gate.min_mean_acceptance_length is not None \
            and fc["mean_acceptance_length"] < gate.min_mean_acceptance_length:
        out.append(f"{where}: mean acceptance length {fc['mean_acceptance_length']:.2f} < "
                   f"min_mean_acceptance_length {gate.min_mean_acceptance_length:.2f}")
    sp = fc.get("speedup")
    if gate.min_speedup is not None and isinstance(sp, (int, float)) and sp < gate.min_speedup:
        out.append(f"measured speedup {sp:.2f}x < min_speedup {gate.min_speedup:.2f}x")
    off = fc.get("offline") if fc.get("source") == "eval" else None
    if gate.max_disagreement is not None and off:
        gap = abs(off["acceptance_rate"] - fc["acceptance_rate"])
        if gap > gate.max_disagreement:
            out.append(f"offline acceptance {off['acceptance_rate']:.1%} vs served {fc['acceptance_rate']:.1%}: "
                       f"disagreement {gap:.1%} > max_disagreement {gate.max_disagreement:.1%} (the offline "
                       "estimate or the serving setup is wrong: check aux layers, chat template, drafter path)")
    return out


def current_forecast(lab, now: float | None = None, starting: str | None = None) -> dict | None:
    """The forecast from the registry as it is (no host round trip), remembered with its time.
    starting: a stage about to start; its own earlier runs under another config are left out (a
    drafter stopped for lr 1e-9 says nothing of the run with the lr fixed; under the same config it
    does, and keeps a stopped stage from starting again)."""
    now = now or time.time()
    runs = lab.registry.runs()
    if starting is not None and any(r.get("stage") == starting for r in runs):
        try:
            fp = lab.fingerprint(lab.cfg.stage(starting))
        except Exception:  # noqa: BLE001 - unknown fingerprint: keep the evidence (the stricter choice)
            fp = None
        if fp is not None:
            runs = [r for r in runs if r.get("stage") != starting or r.get("fingerprint") == fp]
    fc = forecast.make(lab, {"runs": runs}, now)
    try:
        forecast.remember(lab.cfg.logs_dir / forecast.STORE, fc, now)
    except (OSError, ValueError):
        pass  # the history is a nicety; the gate's decision does not depend on it
    return fc


def check(lab, stage: str, now: float | None = None, starting: bool = False) -> list[str]:
    """Why stage's gate fails now ([] without a gate, when it passes, or with --ignore-gates)."""
    gate = lab.cfg.pipeline.gates.get(stage)
    if gate is None or getattr(lab, "ignore_gates", False):
        return []
    return reasons(gate, current_forecast(lab, now, starting=stage if starting else None))


def notify(lab, stage: str, why: list[str], run: dict | None, out: TextIO | None) -> None:
    text = f"gate on {stage} failed: " + "; ".join(why)
    if out is not None:
        print(f"lab: {text}. Stopped; `lab pipeline --ignore-gates` overrides", file=out)
    n = getattr(lab, "notifier", None)
    if n is None:
        return
    payload = {"schema": 1, "event": "gate_failed", "stage": stage, "host": lab.cfg.stage(stage).host,
               "run_id": (run or {}).get("id"), "reason": "; ".join(why), "reasons": why,
               "forecast": current_forecast(lab), "status_url": n.cfg.status_url, "text": text, "at": utcnow_iso()}
    n.send(f"gate:{stage}:{(run or {}).get('id') or int(time.time())}", payload)


def blocked(lab, stage: str, out: TextIO | None) -> dict | None:
    """Before a stage starts: the pipeline's failed record when its gate fails, else None."""
    why = check(lab, stage, starting=True)
    if not why:
        return None
    notify(lab, stage, why, None, out)
    return {"stage": stage, "state": StageState.GATED, "id": None, "gate": why}


class Watch:
    """While a run is waited on: stop it when its stage's gate fails (checked every CHECK_EVERY_S)."""

    def __init__(self, lab, clock=time.monotonic):
        self.lab, self.clock, self.next_at = lab, clock, 0.0

    def __call__(self, run: dict, out: TextIO | None) -> list[str]:
        if self.clock() < self.next_at or run.get("stage") not in self.lab.cfg.pipeline.gates:
            return []
        self.next_at = self.clock() + CHECK_EVERY_S
        why = check(self.lab, run["stage"])
        if why:
            notify(self.lab, run["stage"], why, run, out)
            self.lab.gate_failures[run["id"]] = why
            self.lab.stop(run["id"])
        return why
