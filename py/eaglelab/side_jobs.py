
"""Side jobs: what runs beside the pipeline's current stage instead of after it (docs/foresight.md).

Two kinds, one trigger (`during: {stage, after}`: once that stage's run has made `after` units):
  a pilot     a job declared with `during:` (the first N synth rows through a short pipeline)
  a smoke     `smoke:` on a stage S makes the job `smoke-S`: S's own command plus the smoke's args,
              tried on the first outputs of the stage before S while that one still runs. S may be a
              service (serve_eval beside train: the server on the first checkpoint); its smoke is a job.

Pure: which side jobs exist, what starts them, and what a smoke's failure means for the pipeline;
eaglelab.control.pipeline.side_runs starts and follows them.
"""

from __future__ import annotations

from eaglelab.model import RunState, StageState

from .errors import ConfigError
from .placement import shared

SMOKE_PREFIX = "smoke-"
SERVICE_SMOKE_STOP_S = 45.0  # more time `lab stop` gives a service's smoke: it stops its own server first


def smoke_name(stage: str) -> str:
    return SMOKE_PREFIX + stage


def add_smoke_stages(cfg) -> list[str]:
    """Add `smoke-S` for every stage S with `smoke:` (in place); their names."""
    added = []
    for name, s in list(cfg.stages.items()):
        if s.smoke is None:
            continue
        smoke = smoke_name(name)
        if smoke in cfg.stages:
            raise ConfigError(f"{cfg.conf_dir / 'pipeline.yaml'}: stage name {smoke!r} is taken by eaglelab's smoke "
                              f"test of {name}; rename that stage")
        upstream = cfg.stage(s.smoke.during)
        # The first outputs are on the upstream's host: the smoke runs where it can read them.
        here, there = cfg.host(s.host), cfg.host(upstream.host)
        host = s.host if all(shared(here, there, o) for o in upstream.outputs) else upstream.host
        st = cfg.make_stage(
            # gpus=0: a smoke never stops the running stage's service for its GPUs (a profile whose GPUs
            # are all held then gives the smoke `--device cpu` in its args)
            host=host, command=[*s.command, *s.smoke.args], env={**s.env, **s.smoke.env}, gpus=0,
            # a first-run ETA of its own (a smoke is short; it runs beside, so it never moves the pipeline's)
            prior={"unit": "items", "expected": 1, "per_s": 1, "fixed_s": 60},
            # a service's smoke stops the server it started before it exits (serve_smoke: TERM, 30 s, KILL)
            stop_grace_s=s.stop_grace_s + (SERVICE_SMOKE_STOP_S if s.kind == "service" else 0),
            during={"stage": s.smoke.during, "after": s.smoke.after, "late": False},
            description=f"smoke test of {name}: its command + {' '.join(s.smoke.args)}, on {s.smoke.during}'s "
                        f"first outputs while {s.smoke.during} runs")
        st.name = smoke
        st._smoke_of = name
        cfg.stages[smoke] = st
        added.append(smoke)
    for s in cfg.stages.values():
        if s.during is not None:
            after_units(cfg, s)  # a bad `after` fails at load, not in the middle of a pipeline
    return added


def after_units(cfg, stage) -> int:
    """The trigger's `after`, rendered (it may be a ${var}) and checked."""
    raw = stage.during.after
    text = cfg.render(stage, str(raw), cfg.vars_for(stage))
    try:
        n = int(float(text))
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"{cfg.conf_dir / 'pipeline.yaml'}: stages.{stage.name}: during.after / smoke.after = "
                          f"{raw!r} (-> {text!r}): must be a whole number of units, or a ${{var}} holding one")
    return n


def side_jobs(cfg) -> list[str]:
    return [n for n, s in cfg.stages.items() if s.during is not None]


def progress_units(run: dict | None) -> float:
    """How many units a run has made, from its parsed progress bar (0 without one)."""
    prog = ((run or {}).get("log_state") or {}).get("progress") or {}
    n = prog.get("n") if isinstance(prog, dict) else None
    return float(n) if isinstance(n, (int, float)) else 0.0


def due(cfg, name: str, trigger_run: dict | None) -> bool:
    """Whether side job `name` should start, given the latest run of the stage it runs beside."""
    stage = cfg.stage(name)
    if trigger_run is None:
        return False
    state = trigger_run.get("state")
    if state in (RunState.RUNNING, StageState.STALLED):
        return progress_units(trigger_run) >= after_units(cfg, stage)
    return state == RunState.COMPLETED and stage.during.late


def describe(cfg, name: str) -> str:
    """One line for `lab plan`: when it starts and what it is."""
    s = cfg.stage(name)
    n = after_units(cfg, s)
    when = f"beside {s.during.stage}, once it has made {n} unit(s)" + (
        "" if s.during.late else f" (not once {s.during.stage} has finished)")
    return f"{when}: smoke test of {s.smoke_of}" if s.smoke_of else when
