"""The pilot in a window of its own (`pilot_window: own`; docs/foresight.md, "The pilot's own window").

By default the pilot is a side job beside synth: it extracts with transformers on the host's device
and trains beside synth's server. Where the target holds every GPU (kimi-k2.5: 547 GB over 8 GPUs,
~14 GiB left on each) neither fits beside a server, and after synth the first forecast comes ~7 h
in. `own` puts the pilot first instead, in the gap it needs:

    serve_synth/serve_target -> synth_head (synth's first pilot_samples prompts; the engine check beside it)
    -> serve_extract -> pilot_data (the slice, prepare, extract through serve_extract, vocab: --through vocab)
    -> pilot (its train on a GPU of its own: serve_extract is stopped for it) -> synth (the rest; the head's
    rows reused) -> ... as before

Two more loads of the target (serve_extract for the pilot, synth's server again) buy a forecast in
the first ~1.5 h instead of ~7 h; `lab plan --offline` shows both. This module rewrites the loaded
stages in place (as engine_check_stages does); config.load calls it.
"""

from __future__ import annotations

from pathlib import Path

from .engine_check_stages import JOB as ENGINE_CHECK
from .engine_check_stages import without
from .errors import ConfigError

HEAD, DATA, PILOT, SYNTH = "synth_head", "pilot_data", "pilot", "synth"
HEAD_DIR = "${data}/synth_head"


def add(cfg, where: Path | None) -> list[str]:
    """With `pilot_window: own`, add synth_head and pilot_data, and reorder pilot and synth around them;
    the names added ([] for the default, beside)."""
    if cfg.pipeline.pilot_window != "own":
        return []
    at = f"{where}: pilot_window"
    for name in (SYNTH, PILOT):
        if name not in cfg.stages:
            raise ConfigError(f"{at}: own needs the stages {SYNTH} and {PILOT}; this pipeline has no {name!r}")
    for name in (HEAD, DATA):
        if name in cfg.stages:
            raise ConfigError(f"{at}: stage name {name!r} is taken by the pilot window's own; rename that stage")
    synth, pilot = cfg.stage(SYNTH), cfg.stage(PILOT)
    make = type(synth).model_validate  # config.StageConfig, without importing config (which calls us)

    # services the pilot's data part needs must not wait for the data the pilot comes before
    for svc in pilot.needs:
        s = cfg.stage(svc)
        s.depends_on = [d for d in s.depends_on if SYNTH not in cfg.stage_order([d])]

    prior = None
    if synth.prior is not None:  # synth's, for the first pilot_samples prompts
        prior = synth.prior.model_copy(update={"limit": "${pilot_samples}", "expected": None})
    head = make(dict(
        host=synth.host, env=dict(synth.env), needs=list(synth.needs), depends_on=list(synth.depends_on),
        command=[*without(synth.command, ("--limit", "--out")), "--limit", "${pilot_samples}", "--out", HEAD_DIR],
        inputs=list(synth.inputs), outputs=[HEAD_DIR], slurm=synth.slurm, prior=prior,
        description="synth's first pilot_samples prompts, for the pilot (the full synth reuses them)"))

    cmd = [*without(pilot.command, ("--synth",)), "--synth", HEAD_DIR]
    extract = cfg.stages.get("extract")
    data_prior = None
    if extract is not None and extract.prior is not None:  # the slice at extract's rate, + prepare and vocab
        data_prior = {"unit": extract.prior.unit, "expected": "${pilot_samples}", "per_s": extract.prior.per_s,
                      "fixed_s": 120.0}
    data = make(dict(
        host=pilot.host, env=dict(pilot.env), needs=list(pilot.needs), depends_on=[HEAD],
        command=[*cmd, "--through", "vocab"], inputs=list(pilot.inputs),
        outputs=[f"{o}/vocab" for o in pilot.outputs], slurm=pilot.slurm, prior=data_prior,
        description="the pilot's slice through prepare, extract and vocab (its train follows in pilot)"))

    pilot.command, pilot.during, pilot.needs, pilot.depends_on = cmd, None, [], [DATA]
    if pilot.gpus == 0 and cfg.host(pilot.host).gpus > 0:
        pilot.gpus = 1  # a GPU of its own: the services on it are stopped first (Lab._free_gpus_for)
    synth.command = [*synth.command, "--reuse", HEAD_DIR]
    synth.after = [*synth.after, PILOT]  # the forecast first; the full synth does not need it to succeed

    ec = cfg.stages.get(ENGINE_CHECK)
    if ec is not None and ec.during is not None and ec.during.stage == SYNTH:
        rows, head_rows = str(cfg.pipeline.engine_check.rows), str(cfg.pipeline.vars.get("pilot_samples", ""))
        if rows.isdigit() and head_rows.isdigit() and int(rows) > int(head_rows):
            raise ConfigError(f"{at}: own: the engine check runs beside synth_head, which makes pilot_samples = "
                              f"{head_rows} rows, but engine_check.rows is {rows}: it would wait for rows that never "
                              "come; make engine_check.rows <= vars.pilot_samples")
        ec.during = ec.during.model_copy(update={"stage": HEAD})  # vLLM's counters in the first minutes
        ec.command = [*without(ec.command, ("--synth",)), "--synth", HEAD_DIR]
    head.name, data.name = HEAD, DATA
    cfg.stages[HEAD], cfg.stages[DATA] = head, data
    return [HEAD, DATA]
