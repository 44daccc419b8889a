"""What a pipeline firing would do, per job, and why — computed without doing it.

Each job's own verdict comes from `Lab.decide` (attach | skip | run, from the registry's latest run
and the stage's fingerprint). One more rule only makes sense for a whole pipeline, so it lives
here: when an upstream job will run (or is running now), every job downstream of it through
`depends_on` must run after it, even if its own fingerprint matches today — the upstream is about
to replace its inputs. `lab pipeline` reaches the same verdicts while it goes: once the upstream
has run again, `Lab.decide` sees that it started after the downstream's latest run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .lab import Lab


@dataclass(frozen=True)
class Step:
    stage: str
    action: str  # attach | skip | run
    reason: str
    latest_run: str | None = None
    host: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def propagate(order: list[str], depends_on: dict[str, list[str]],
              own: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Pure: each stage's (action, reason) after upstream reruns flow downstream.

    order is a dependency order; own holds each stage's verdict on its own. A stage that would be
    skipped runs when one of its depends_on stages will run or is running (attach)."""
    out: dict[str, tuple[str, str]] = {}
    for name in order:
        action, reason = own[name]
        if action == "skip":
            moving = [d for d in depends_on.get(name, []) if d in out and out[d][0] in ("run", "attach")]
            if moving:
                d = moving[0]
                verb = "will rerun" if out[d][0] == "run" else "is running now"
                action, reason = "run", f"upstream {d} {verb}, so its outputs change"
        out[name] = (action, reason)
    return out


def make_plan(lab: Lab, stages: list[str] | None = None, force: bool = False,
              refresh: bool = True) -> list[Step]:
    """The jobs a pipeline (or `lab run STAGES --deps`) would go through, in order, with verdicts."""
    unreachable = {h: e for h, e in (lab.refresh() if refresh else {}).items() if e}
    order = [n for n in lab.cfg.stage_order(stages) if lab.cfg.stage(n).kind == "job"]
    own, latest = {}, {}
    for name in order:
        action, reason, rec = lab.decide(name, force)
        own[name] = (action, reason)
        latest[name] = rec["id"] if rec else None
    final = propagate(order, {n: lab.cfg.stage(n).depends_on for n in order}, own)
    steps = []
    for n in order:
        action, reason = final[n]
        host = lab.cfg.stage(n).host
        if host in unreachable:  # say so: the verdict rests on what was known before the host went away
            reason += f" [host {host} unreachable: {unreachable[host]}; from its last known state]"
        steps.append(Step(n, action, reason, latest_run=latest[n], host=host))
    return steps


def format_plan(steps: list[Step]) -> list[str]:
    width = max((len(s.stage) for s in steps), default=0)
    return [f"{s.stage:<{width}}  {s.action:<6}  {s.reason}" for s in steps]
