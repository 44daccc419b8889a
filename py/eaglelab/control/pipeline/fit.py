"""The config's side of the plan that knows what fits: the pipeline's stages as eaglelab.sizing reads
them, the model's facts found, the plan formatted, and the refusal `lab preflight` and `lab pipeline`
give a plan that does not fit (docs/planning.md). Contacts no host.

Facts: the model's own config.json when `${model}` is a directory here (the demo's, once made), else
`conf/facts/<profile>.yaml`; neither: no plan of memory (the stages' priors still give time).
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from eaglelab import pilot_window
from eaglelab.config import REPO_ROOT, Config, ConfigError, prior_numbers
from eaglelab.errors import StageError
from eaglelab.figures import human_duration as duration
from eaglelab.sizing import facts as facts_mod
from eaglelab.sizing.timeline import Plan, PriorNumbers, Settings, StageSpec, beside_order, plan

ROLES = {"serve": "serve", "synth": "synth", "eval": "eval", "prepare": "prepare", "vocab": "vocab",
         "extract": "extract", "train": "train", "pilot": "pilot"}
BUDGET_VAR = "plan_budget_h"  # a profile's time budget for the whole pipeline (hours; "": none)


def flags_of(argv: list[str]) -> dict[str, str]:
    """`--flag value` pairs of a rendered command (a bare switch -> "")."""
    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if nxt is None or (nxt.startswith("--") and " " not in nxt):
                out[a[2:]] = ""
                i += 1
                continue
            out[a[2:]] = nxt
            i += 2
            continue
        i += 1
    return out


def role_of(argv: list[str], smoke_of: str | None) -> str:
    if smoke_of:
        return "smoke"
    for a in argv:
        m = re.fullmatch(r"eaglelab\.stages\.(\w+)", a)
        if m:
            return ROLES.get(m.group(1), "other")
    return "other"


def find_facts(cfg: Config) -> facts_mod.Facts | None:
    """The model's config.json if it is here, else the profile's facts file; None: neither."""
    path = cfg.conf_dir / "facts" / f"{cfg.profile}.yaml"
    from_file = facts_mod.load_facts(path) if path.is_file() else None
    try:
        model_dir = Path(render_var(cfg, "model") or "-")  # "-": no such directory
    except ConfigError:  # a ${var} it names is not set: no model here
        model_dir = Path("-")
    if not model_dir.is_absolute():
        model_dir = REPO_ROOT / model_dir
    if (model_dir / "config.json").is_file():
        model = facts_mod.read_config_json(model_dir)
        if from_file is None:
            return facts_mod.Facts(model, source=model.source)
        return facts_mod.Facts(model, from_file.hosts, from_file.workload, from_file.rates, model.source)
    return from_file


def render_var(cfg: Config, name: str) -> str:
    stage = next(iter(cfg.stages.values()))
    variables = cfg.vars_for(stage)
    return cfg.render(stage, variables.get(name, ""), variables)


def _spec(cfg: Config, name: str) -> StageSpec:
    s = cfg.stage(name)
    variables = cfg.vars_for(s)
    argv = [cfg.render(s, a, variables) for a in s.command]
    prior = None
    if s.prior is not None:
        nums = prior_numbers(cfg, s)
        size = nums["limit"] if nums["limit"] is not None else nums["expected"]
        prior = PriorNumbers(s.prior.per_s, s.prior.fixed_s, size, nums["times"] or 1.0, s.prior.spread, s.prior.unit)
    beside = s.during.stage if s.during is not None else None
    return StageSpec(name, s.kind, s.host, role_of(argv, s.smoke_of), s.gpus, tuple(s.needs), beside,
                     flags_of(argv), prior,
                     after_data_part=name == pilot_window.PILOT and cfg.pipeline.pilot_window == "own")


def make_fit_plan(cfg: Config, stages: list[str] | None = None,
                  gpu_memory_gib: dict[str, float] | None = None,
                  model: facts_mod.ModelFacts | None = None) -> Plan | None:
    """The plan of every job (and the services they need) in the pipeline's order; None without facts.
    gpu_memory_gib: a host's GPU memory as the host itself reported it (preflight), over the facts file's;
    model: the model's shape from its config.json on the host (preflight), over the facts file's."""
    facts = find_facts(cfg)
    if model is not None:
        if facts is None:
            facts = facts_mod.Facts(model, source=model.source)
        else:  # the host's config.json; the weights' bytes from the facts file if the host has no safetensors
            keep = model.weight_bytes or facts.model.weight_bytes
            facts = replace(facts, model=replace(model, weight_bytes=keep), source=model.source)
    if facts is None:
        return None
    if gpu_memory_gib:
        hosts = {**facts.hosts, **{h: replace(facts.host(h), gpu_memory_gib=g) for h, g in gpu_memory_gib.items()}}
        facts = replace(facts, hosts=hosts)
    order = [n for n in cfg.stage_order(stages) if cfg.stage(n).kind == "job"]
    order = beside_order(order, {n: cfg.stage(n).during.stage for n in order if cfg.stage(n).during})
    services = {svc for n in order for svc in cfg.stage(n).needs}
    specs = [_spec(cfg, n) for n in order] + [_spec(cfg, n) for n in cfg.stage_order() if n in services]
    v = {k: render_var(cfg, k) for k in ("aux_layers", "draft_vocab_size", "synth_limit", BUDGET_VAR)
         if k in cfg.pipeline.vars}
    budget = v.get(BUDGET_VAR) or ""
    try:
        settings = Settings(host_gpus={h: c.gpus for h, c in cfg.hosts.items()},
                            samples=float(v.get("synth_limit") or 0),
                            aux_layers=len(str(v.get("aux_layers", "2 16 29")).replace(",", " ").split()),
                            draft_vocab=int(v.get("draft_vocab_size") or 32000),
                            budget_s=float(budget) * 3600 if budget else None)
    except ValueError as e:
        raise ConfigError(f"vars: {e}; synth_limit, draft_vocab_size and {BUDGET_VAR} (hours) must be numbers") from e
    return plan(specs, facts, settings)


def _gib(g: float | None) -> str:
    return "-" if g is None else f"{g:,.1f}"


def _bytes(b: float | None) -> str:
    if b is None:
        return "-"
    return f"{b / 1e9:,.1f} GB" if b >= 1e8 else f"{b / 1e6:,.1f} MB"


def format_fit(p: Plan) -> list[str]:
    head = ["stage", "host", "GPUs", "GPU GiB/GPU", "RAM GiB", "disk", "time", "range", "from", "until", "beside"]
    rows = []
    for e in p.stages:
        rows.append([e.stage, e.host, e.gpus, _gib(e.gpu.device_gib if e.gpu else None),
                     _gib(e.ram_gib.value if e.ram_gib else None), _bytes(e.disk_bytes.value if e.disk_bytes else None),
                     duration(e.seconds.value), f"{duration(e.low_s)}-{duration(e.high_s)}",
                     f"+{duration(e.start_s)}", f"+{duration(e.end_s)}", ", ".join(e.beside)])
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    lines.append(f"-- the pipeline ends after ~{duration(p.total_s)} (facts: {p.facts_source})")
    if p.first_forecast is not None:
        lines.append(f"-- the first acceptance forecast: when {p.first_forecast.stage} ends, "
                     f"~{duration(p.first_forecast.end_s)} after the start")
    lines.append("where the figures come from:")
    for e in p.stages:
        lines.append(f"  {e.stage}: time {e.seconds.source}: {e.seconds.note}")
        if e.gpu:
            parts = "; ".join(f"{n} {f.value:,.2f} ({f.source})" for n, f in e.gpu.parts)
            lines.append(f"    GPU: {parts}" + (f"; KV cache {e.kv}" if e.kv else ""))
        if e.disk_bytes:
            lines.append(f"    disk {e.disk_bytes.source}: {e.disk_bytes.note}")
    if p.misfits:
        lines.append(f"DOES NOT FIT ({len(p.misfits)}):")
        lines += [f"  {m.line()}" for m in p.misfits]
    else:
        lines.append("fits: no stage over a GPU's memory, a disk or the time budget")
    return lines


def refuse_misfits(cfg: Config, stages: list[str] | None = None) -> None:
    """`lab pipeline`'s hook: a StageError naming every misfit (EAGLELAB_NO_FIT=1 skips it)."""
    if os.environ.get("EAGLELAB_NO_FIT") == "1":
        return
    p = make_fit_plan(cfg, stages)
    if p is not None and p.misfits:
        raise StageError("the plan does not fit (`lab plan --offline` shows it):\n  "
                         + "\n  ".join(m.line() for m in p.misfits)
                         + "\n(EAGLELAB_NO_FIT=1 runs it anyway)")


def stage_misfits(cfg: Config, stage: str) -> list | None:
    """The misfits of the plan that name `stage` (or the whole pipeline's time); None without facts."""
    p = make_fit_plan(cfg)
    if p is None:
        return None
    return [m for m in p.misfits if m.stage in (stage, "pipeline")]
