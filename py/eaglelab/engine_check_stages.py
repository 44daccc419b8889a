"""The stages an `engine_check:` key adds (docs/foresight.md, "The engine check").

With `engine_check: {drafter: PATH, min_ratio: 0.6}` in a profile (or conf/pipeline.yaml):

- `serve_synth`, a service: serve_target's own command on a port of its own, plus `--mode eval
  --drafter D`: the target WITH the drafter, speculative decoding on. Greedy verification keeps the
  output what the target alone makes, so synth's rows are the same; what changes is that vLLM now
  drafts and counts its acceptance. It stops as soon as synth is done (keep_alive_s 0), so the
  no-speculation baseline (eval_baseline on serve_target) still measures the target alone.
- `synth` needs serve_synth instead of serve_target and talks to its port (a later `--endpoint` wins).
- `engine_check`, a side job beside synth once synth has made `rows` rows (or at once if synth has
  finished): vLLM's counters against the same drafter's offline acceptance on those rows
  (eaglelab.stages.engine_check); a served figure below min_ratio x the offline one fails it as an
  engine-path alarm.
"""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError

SERVICE, JOB = "serve_synth", "engine_check"
SOURCE_SERVICE, SYNTH = "serve_target", "synth"


def without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """argv less these options and their values (`--opt VALUE` or `--opt=VALUE`) (pure)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not any(a.startswith(o + "=") for o in options):
            out.append(a)
    return out


def add(cfg, where: Path | None) -> list[str]:
    """Add serve_synth and engine_check and point synth at serve_synth (in place) when the pipeline has
    an engine_check key; the names added."""
    ec = cfg.pipeline.engine_check
    if ec is None:
        return []
    at = f"{where}: engine_check"
    for name in (SOURCE_SERVICE, SYNTH):
        if name not in cfg.stages:
            raise ConfigError(f"{at}: the engine check serves synth's target with the drafter, and needs the stages "
                              f"{SOURCE_SERVICE} and {SYNTH}; this pipeline has no {name!r}. Remove engine_check "
                              "or add the stage")
    for name in (SERVICE, JOB):
        if name in cfg.stages:
            raise ConfigError(f"{at}: stage name {name!r} is taken by the engine check's own; rename that stage")
    target, synth = cfg.stage(SOURCE_SERVICE), cfg.stage(SYNTH)
    stage_model = type(target)  # config.StageConfig, without importing config (which calls us): no import circle
    if SOURCE_SERVICE not in synth.needs:
        raise ConfigError(f"{at}: stages.synth does not need {SOURCE_SERVICE}; the engine check replaces that server")
    port = str(ec.port)
    served = ec.served_drafter or ec.drafter
    endpoint = f"http://${{host_addr}}:{port}"
    ready = {**(target.ready.model_dump() if target.ready else {}), "url": f"{endpoint}/health"}
    svc = stage_model.model_validate(dict(
        kind="service", host=target.host, env=dict(target.env), gpus=target.gpus, ready=ready,
        command=[*without(target.command, ("--port", "--mode")), "--port", port, "--mode", "eval", "--drafter", served,
                 "--num-speculative-tokens", "${num_speculative_tokens}"],
        inputs=[*target.inputs, served], depends_on=list(target.depends_on), stop_grace_s=target.stop_grace_s,
        slurm=target.slurm, prior=target.prior, keep_alive_s=0,  # gone once synth is: eval_baseline's server is plain
        description=f"the target with the drafter {served} (speculative decoding) for synth: the engine check"))
    svc.name = SERVICE
    synth.needs = [SERVICE if n == SOURCE_SERVICE else n for n in synth.needs]
    synth.command = [*synth.command, "--endpoint", endpoint]
    cmd = ["${python}", "-m", "eaglelab.stages.engine_check", "--synth", "${data}/synth", "--model", "${model}",
           "--drafter", ec.drafter, "--served-drafter", served, "--endpoint", endpoint, "--rows", str(ec.rows),
           "--min-ratio", str(ec.min_ratio), "--min-drafts", str(ec.min_drafts), "--probe-prompts", str(ec.output_probe), "--k", "${num_speculative_tokens}",
           "--temperature", "${synth_temperature}", "--top-p", "${synth_top_p}", "--seq-length", "${seq_length}",
           "--device", "${device}", "--out", "${data}/engine_check", "${trust_remote_code}"]
    if ec.offline_rate is not None:
        cmd += ["--offline-rate", str(ec.offline_rate)]
    job = stage_model.model_validate(dict(
        host=synth.host, env=dict(synth.env), command=cmd, inputs=["${model}", ec.drafter],
        outputs=["${data}/engine_check"], during={"stage": SYNTH, "after": ec.rows, "late": True},
        prior={"unit": "items", "expected": 1, "per_s": 1, "fixed_s": 60},
        description="vLLM's served acceptance of the drafter against its offline acceptance on the same synth rows"))
    job.name = JOB
    cfg.stages[SERVICE], cfg.stages[JOB] = svc, job
    return [SERVICE, JOB]
