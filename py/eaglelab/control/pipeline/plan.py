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

from eaglelab import side_jobs
from eaglelab.sizing.timeline import beside_order  # pure; side jobs after their stage

from ..lab import Lab


@dataclass(frozen=True)
class Step:
    stage: str
    action: str  # attach | skip | run
    reason: str
    latest_run: str | None = None
    host: str = ""
    settings: str = ""  # the job's key settings, and those of the services it needs (key_settings)

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


def key_settings(argv: list[str]) -> str:
    """Pure: a command's settings worth seeing in a plan: `--flag value` pairs and bare switches, paths
    and URLs left out (they say where, not how; a warm start's drafter says how, so it stays):
    `concurrency=64 max-tokens=16384 reasoning`."""
    out, i = [], 0
    while i < len(argv):
        flag, nxt = argv[i], (argv[i + 1] if i + 1 < len(argv) else None)
        if not flag.startswith("--"):
            i += 1
            continue
        if nxt is None or (nxt.startswith("--") and " " not in nxt):  # a switch: --reasoning
            out.append(flag[2:])
            i += 1
            continue
        if nxt.startswith("--"):  # a string of flags passed on (serve's --vllm-args)
            out.append(f"{flag[2:]}={nxt!r}")
        elif nxt and (flag == "--warm-start" or "/" not in nxt and not nxt.startswith("http")):
            out.append(f"{flag[2:]}={nxt!r}" if " " in nxt else f"{flag[2:]}={nxt}")
        i += 2
    return " ".join(out)


def stage_settings(lab: Lab, name: str) -> str:
    """The job's key settings; then, for each service it needs, that service's."""
    stage = lab.cfg.stage(name)
    parts = [key_settings(lab.launch_spec(stage)["command"])]
    for svc in stage.needs:
        parts.append(f"needs {svc}: {key_settings(lab.launch_spec(lab.cfg.stage(svc))['command'])}")
    return "; ".join(p for p in parts if p)


def make_plan(lab: Lab, stages: list[str] | None = None, force: bool = False,
              refresh: bool = True) -> list[Step]:
    """The jobs a pipeline (or `lab run STAGES --deps`) would go through, in order, with verdicts."""
    unreachable = {h: e for h, e in (lab.refresh() if refresh else {}).items() if e}
    order = [n for n in lab.cfg.stage_order(stages) if lab.cfg.stage(n).kind == "job"]
    order = beside_order(order, {n: lab.cfg.stage(n).during.stage for n in order if lab.cfg.stage(n).during})
    own, latest = {}, {}
    for name in order:
        action, reason, rec = lab.decide(name, force)
        if lab.cfg.stage(name).during is not None and action != "attach":  # a side job (docs/foresight.md)
            action, reason = "beside", side_jobs.describe(lab.cfg, name)
        own[name] = (action, reason)
        latest[name] = rec["id"] if rec else None
    final = propagate(order, {n: lab.cfg.stage(n).depends_on for n in order}, own)
    steps = []
    for n in order:
        action, reason = final[n]
        host = lab.cfg.stage(n).host
        if host in unreachable:  # say so: the verdict rests on what was known before the host went away
            reason += f" [host {host} unreachable: {unreachable[host]}; from its last known state]"
        steps.append(Step(n, action, reason, latest_run=latest[n], host=host, settings=stage_settings(lab, n)))
    return steps


def format_plan(steps: list[Step], settings: bool = False) -> list[str]:
    width = max((len(s.stage) for s in steps), default=0)
    lines = []
    for s in steps:
        lines.append(f"{s.stage:<{width}}  {s.action:<6}  {s.reason}")
        if settings and s.settings:
            lines.append(f"{'':<{width}}  {'':<6}  {s.settings}")
    return lines
