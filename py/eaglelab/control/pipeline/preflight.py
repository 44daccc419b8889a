"""Checks before a stage starts, so that it fails now and not at hour four.

One verdict per check, each with its reason and the fix:
  host       the host answers and can run our package
  env        the host's package versions equal its lock (the seeds lost hours to a container
             whose Python environment differed from the workstation's)
  disk       free disk where the outputs go >= the stage's estimated output
  gpus       enough GPUs with enough free memory
  inputs     every input path exists on the host
  drafter    a serving stage's EAGLE-3 drafter uses only config fields the host's vLLM understands
             (speculators 0.9.0 writes norm_before_fc, norm_output and sliding windows; an older
             vLLM ignores them without a word, and acceptance collapses)
The estimators and comparisons are pure functions; `run` gathers the host's facts in one call.
`Lab.run` calls `before_launch` just before launching (EAGLELAB_NO_PREFLIGHT=1 skips it).
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict
from pathlib import Path

from eaglelab import placement
from eaglelab.config import REPO_ROOT, StageConfig, slurm_options
from eaglelab.errors import ConfigError, HostError, StageError
from eaglelab.sizing import facts as facts_mod

from ..executors import HostUnreachable
from . import slurm_preflight
from .checks import Check
from .fit import make_fit_plan

BF16_BYTES = 2
DEFAULT_AUX_LAYERS = 3  # EAGLE-3: three aux layers [2, L//2, L-3] (+ the last layer)
TOKEN_KEYS = ("tokens", "total_tokens", "sum_seq_len", "num_tokens")
# pipeline vars the estimates read (each may refer to other vars)
ESTIMATE_VARS = ("hidden_size", "aux_layers", "total_tokens", "num_samples", "synth_limit", "seq_length",
                 "gpu_mem_mib", "gpu_memory_utilization")


# -- pure cores --------------------------------------------------------------------------------

def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str, source: str = "requirements.lock") -> dict[str, str]:
    """`name==version` lines (comments, blanks, pip options and markers ignored) -> {name: version}."""
    pins = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;]+)\s*(;.*)?", line)
        if not m:
            raise StageError(f"{source}:{n}: {raw!r} is not `name==version`; the lock pins exact versions")
        pins[canonical(m.group(1))] = m.group(3)
    return pins


def diff_packages(lock: dict[str, str], installed: dict[str, str]) -> list[tuple[str, str, str | None]]:
    """[(name, version in the lock, version on the host or None)] for every pin the host misses."""
    have = {canonical(k): v for k, v in installed.items()}
    return [(name, want, have.get(name)) for name, want in sorted(lock.items()) if have.get(name) != want]


def hidden_states_bytes(total_tokens: int, aux_layers: int, hidden_size: int, dtype_bytes: int = BF16_BYTES) -> int:
    """Disk for EAGLE-3 hidden states: Σ seq_len × (aux layers + 1) × hidden × 2 bytes (bf16)."""
    return int(total_tokens) * (int(aux_layers) + 1) * int(hidden_size) * int(dtype_bytes)


def _aux_count(value) -> int:
    """`aux_layers` as a count (3) or as the layer ids ("2,30,58" / [2, 30, 58])."""
    if isinstance(value, (list, tuple)):
        return len(value)
    s = str(value).strip().strip("[]")
    parts = [p for p in re.split(r"[,\s]+", s) if p]
    return int(parts[0]) if len(parts) == 1 else len(parts)


def estimate_output_bytes(stage: StageConfig, variables: dict, manifests: dict[str, dict]) -> tuple[int | None, str]:
    """(bytes or None, how it was estimated) for a stage's outputs.

    A stage that writes hidden states (an output path naming `hidden_states`) is estimated from
    the prepared data's token count (its input manifest's counts.tokens, else vars total_tokens,
    else num_samples (or synth_limit) × seq_length as an upper bound), vars aux_layers (a count or
    the layer ids) and hidden_size (else the input manifest's extra.hidden_size).
    """
    if not any("hidden_states" in o for o in stage.outputs):
        return None, "no estimate for this stage (it writes no hidden states)"
    hidden = variables.get("hidden_size")
    if hidden in (None, ""):  # the prepare stage records the target's hidden size in its manifest
        hidden = next((m["extra"]["hidden_size"] for m in manifests.values()
                       if (m.get("extra") or {}).get("hidden_size")), None)
    if hidden in (None, ""):
        return None, "hidden states, but no `hidden_size` (vars or the input manifest's extra): cannot estimate"
    aux = _aux_count(variables.get("aux_layers", DEFAULT_AUX_LAYERS))
    tokens, source = None, ""
    for path, m in manifests.items():
        counts = m.get("counts") or {}
        for key in TOKEN_KEYS:
            if counts.get(key) is not None:
                tokens, source = int(counts[key]), f"{path}/manifest.json counts.{key}"
                break
        if tokens is not None:
            break
    if tokens is None and variables.get("total_tokens") not in (None, ""):
        tokens, source = int(variables["total_tokens"]), "vars total_tokens"
    samples_key = next((k for k in ("num_samples", "synth_limit") if variables.get(k)), None)
    if tokens is None and samples_key and variables.get("seq_length"):
        tokens = int(variables[samples_key]) * int(variables["seq_length"])
        source = f"vars {samples_key} × seq_length (upper bound: every sample full length)"
    if tokens is None:
        return None, "hidden states, but no token count (input manifest counts.tokens or vars total_tokens)"
    est = hidden_states_bytes(tokens, aux, int(hidden))
    return est, f"{tokens:,} tokens ({source}) × ({aux} aux + 1) layers × {int(hidden)} hidden × 2 B"


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_env(lock_path: Path, packages: dict[str, str], host: str) -> Check:
    try:
        lock = parse_lock(lock_path.read_text(), str(lock_path))
    except FileNotFoundError:
        return Check("env", False, f"lock {lock_path} not found", f"set hosts.{host}.lock in conf/lab.yaml")
    diffs = diff_packages(lock, packages)
    if not diffs:
        return Check("env", True, f"{len(lock)} packages on {host} match {lock_path.name}")
    shown = ", ".join(f"{n} (lock {w}, host {h or 'missing'})" for n, w, h in diffs[:12])
    more = f" and {len(diffs) - 12} more" if len(diffs) > 12 else ""
    return Check("env", False, f"{len(diffs)} package(s) on {host} differ from {lock_path.name}: {shown}{more}",
                 f"`lab sync {host}` (reinstalls the venv from the lock)")


def check_disk(estimate: int | None, how: str, free: int | None, where: str) -> Check:
    if estimate is None:  # WARN when a hidden-states stage could not be estimated, else PASS
        return Check("disk", None if how.startswith("hidden states") or not free else True,
                     f"{how}; {gib(free or 0)} free at {where}")
    if free is None:
        return Check("disk", None, f"estimated output {estimate:,} B ({gib(estimate)}); free disk unknown")
    verdict = estimate <= free
    return Check("disk", verdict,
                 f"estimated output {estimate:,} B ({gib(estimate)}) {'<=' if verdict else '>'} "
                 f"free {free:,} B ({gib(free)}) at {where}; {how}",
                 "free disk there, or point the stage's outputs at a larger filesystem")


def check_gpus(need: int, mem_mib: float | None, gpus: list[dict] | None, host: str,
               utilization: float | None = None) -> Check:
    """Enough GPUs with mem_mib free each — or, for a vLLM stage, with its gpu_memory_utilization
    share of the GPU free (vLLM refuses to start below it; the seeds' GPU 0 had 91 of 95 GB held)."""
    if need <= 0:
        return Check("gpus", True, "the stage needs no GPU")
    if gpus is None:
        return Check("gpus", False, f"the stage needs {need} GPU(s); {host} has none (no nvidia-smi)",
                     "run it on a GPU host (stages.NAME.host)")
    free = [(g.get("memory_total_mib") or 0) - (g.get("memory_used_mib") or 0) for g in gpus]
    if mem_mib is not None:
        fit = [f for f in free if f >= mem_mib]
        want = f" with {mem_mib:,.0f} MiB free"
    elif utilization is not None:
        fit = [f for f, g in zip(free, gpus) if f >= utilization * (g.get("memory_total_mib") or 0)]
        want = f" with {utilization:.0%} of their memory free (gpu_memory_utilization)"
    else:
        fit, want = free, ""
    detail = f"{len(fit)} of {len(gpus)} GPU(s) on {host}{want}; the stage needs {need} (free MiB: " \
             f"{', '.join(f'{f:,.0f}' for f in free)})"
    return Check("gpus", len(fit) >= need, detail,
                 "stop what holds the GPUs (`lab status` shows services; zombie children show as orphans)")


def check_inputs(digest: dict[str, str], where: dict[str, str] | None = None) -> Check:
    """where: for a missing input, where it actually is (which stage makes it, on which host)."""
    missing = [p for p, d in digest.items() if d == "missing"]
    if missing:
        hints = [where[p] for p in missing if (where or {}).get(p)]
        return Check("inputs", False, f"missing on the host: {', '.join(missing)}",
                     "; ".join(hints) or "run the stages that make them first (`lab run STAGE --deps`)")
    return Check("inputs", True, f"{len(digest)} input(s) present" if digest else "no inputs declared")


# what a drafter field means, and the speculators train flag that leaves it out
DRAFTER_FIELDS = {
    "norm_before_residual": ("hidden_norm before the residual", "--no-norm-before-residual"),
    "norm_before_fc": ("one RMSNorm before the fc projection (Eagle 3.1)", "--no-norm-before-fc"),
    "fc_norm": ("a per-layer RMSNorm before the fc projection", "no --fc-norm"),
    "norm_output": ("post-norm hidden states fed back across steps (Eagle 3.1)", "--no-norm-output"),
    "sliding_window": ("sliding-window attention in the draft layers",
                       "--full-attention-indices listing every draft layer"),
}


def drafter_needs(drafter: dict) -> list[str]:
    """The fields a drafter's config turns on (what vLLM must understand to serve it as trained)."""
    needs = [f for f in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output") if drafter.get(f)]
    if drafter.get("sliding_window") and "sliding_attention" in (drafter.get("layer_types") or []):
        needs.append("sliding_window")
    return needs


def check_drafter(drafters: dict[str, dict], vllm: dict | None, host: str) -> Check:
    """Each drafter's fields against the host vLLM's (eaglelab.host.vllm_support)."""
    if vllm is None:
        return Check("drafter", False, f"no vLLM installed on {host} to serve {', '.join(drafters)}",
                     f"`lab sync {host}` (the lock pins vLLM)")
    problems, flags = [], set()
    for path, d in drafters.items():
        arch = d.get("arch") or "llama"
        known = (vllm.get("eagle3") or {}).get(arch)
        if known is None:
            problems.append(f"drafter {path}: draft arch {arch!r} is not one vLLM {vllm['version']} serves as EAGLE-3")
            continue
        for field in drafter_needs(d):
            if not known.get(field):
                what, flag = DRAFTER_FIELDS[field]
                problems.append(f"drafter {path} sets {field} ({what}), which vLLM {vllm['version']} on {host} "
                                f"does not read: it would serve the drafter without it")
                flags.add(flag)
    if problems:
        return Check("drafter", False, "; ".join(problems),
                     f"install a vLLM that reads these fields on {host} (put it in the host's lock, then "
                     f"`lab sync {host}`), or retrain the drafter without them (speculators train "
                     f"{', '.join(sorted(flags)) or 'with a llama or qwen3 draft arch'})")
    shown = ", ".join(f"{p} ({', '.join(drafter_needs(d)) or 'plain EAGLE-3'})" for p, d in drafters.items())
    return Check("drafter", True, f"vLLM {vllm['version']} on {host} reads every field of {shown}")


# -- gathering the facts -----------------------------------------------------------------------

def lock_path(host) -> Path:
    p = Path(host.lock).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


def host_facts(ex, spec: dict) -> dict:
    """One round trip: the host's packages, free disk at the outputs, GPUs, inputs."""
    return ex.facts(spec["inputs"], spec["outputs"], spec["cwd"])


def run(lab, stage_name: str, spec: dict | None = None) -> list[Check]:
    stage = lab.cfg.stage(stage_name)
    host = lab.cfg.host(stage.host)
    ex = lab.executor(stage.host)
    try:
        spec = spec or lab.launch_spec(stage)
        facts = host_facts(ex, spec)
    except HostUnreachable as e:
        return [Check("host", False, str(e), f"check the link: `{ex.try_command()}`"), *fit_checks(lab, stage_name)]
    except HostError as e:
        return [Check("host", False, str(e), f"`lab sync {stage.host}`"), *fit_checks(lab, stage_name)]
    checks = [Check("host", True, f"{stage.host} answers (hostname {facts.get('hostname')}, "
                                  f"python {facts.get('python_version')} at {facts.get('python')})")]
    checks.append(check_env(lock_path(host), facts.get("packages") or {}, stage.host))
    raw = lab.cfg.vars_for(stage)
    variables = {k: lab.cfg.render(stage, raw[k], raw) for k in ESTIMATE_VARS if k in raw}
    est, how = estimate_output_bytes(stage, variables, facts.get("manifests") or {})
    disk = facts.get("free_disk_bytes") or {}
    where = next((o for o in spec["outputs"] if "hidden_states" in o),
                 spec["outputs"][0] if spec["outputs"] else ex.work_dir)
    free = disk.get(where, min(disk.values()) if disk else None)
    checks.append(check_disk(est, how, free, where))
    mem, util = variables.get("gpu_mem_mib"), variables.get("gpu_memory_utilization")
    if host.reach == "slurm":  # Slurm hands out the GPUs: can the request ever be met?
        opts = spec.get("slurm") or slurm_options(host, stage)
        checks.extend(slurm_preflight.checks(ex.slurm_facts(), opts, stage.host))
        checks.append(check_inputs(facts.get("inputs") or {}, input_origins(lab, stage, spec["inputs"])))
        return checks
    checks.append(check_gpus(stage.gpus, float(mem) if mem not in (None, "") else None, facts.get("gpus"),
                             stage.host, float(util) if util not in (None, "") else None))
    checks.append(check_inputs(facts.get("inputs") or {}, input_origins(lab, stage, spec["inputs"])))
    if stage.kind == "service" and facts.get("drafters"):  # a server that will load a drafter
        checks.append(check_drafter(facts["drafters"], facts.get("vllm"), stage.host))
    return checks + fit_checks(lab, stage_name, gpu_memory_of(stage.host, facts.get("gpus")),
                               host_model(lab, stage, facts.get("model_configs") or {}))


def gpu_memory_of(host: str, gpus: list[dict] | None) -> dict[str, float]:
    """{host: its smallest GPU's memory in GiB} from the host's own nvidia-smi; {} without GPUs."""
    totals = [g["memory_total_mib"] for g in gpus or [] if g.get("memory_total_mib")]
    return {host: min(totals) / 1024} if totals else {}


def host_model(lab, stage: StageConfig, configs: dict[str, dict]):
    """The model's facts from its config.json as the stage's host answered it (hostfacts.model_configs),
    when the pipeline's ${model} is among this stage's inputs there; None otherwise or unreadable."""
    try:
        model = lab.cfg.render(stage, "${model}", lab.cfg.vars_for(stage))
    except ConfigError:
        return None
    got = configs.get(model)
    if not isinstance(got, dict) or not isinstance(got.get("config"), dict):
        return None
    try:
        return facts_mod.from_config_json(got["config"], int(got.get("weight_bytes") or 0),
                                          source=f"{stage.host}:{model}/config.json", name=Path(model).name)
    except (ConfigError, TypeError, ValueError):
        return None  # not a shape the planner reads: the facts file's figures stand


def fit_checks(lab, stage_name: str, gpu_memory_gib: dict[str, float] | None = None, model=None) -> list[Check]:
    """The plan's word (eaglelab.control.pipeline.fit, docs/planning.md): this stage's misfits and the budget's
    fail it; another stage's are a warning now; no model facts: no check. With the host's own GPU
    memory and the model's own config.json when it answered, else the facts file's."""
    if os.environ.get("EAGLELAB_NO_FIT") == "1":
        return [Check("fit", None, "not checked: EAGLELAB_NO_FIT=1")]
    p = make_fit_plan(lab.cfg, gpu_memory_gib=gpu_memory_gib, model=model)
    if p is None:
        return []
    if not p.misfits:
        return [Check("fit", True, "the plan fits: no stage over a GPU's memory, a disk or the time budget "
                                   "(`lab plan --offline`)")]
    out = []
    for m in p.misfits:
        mine = m.stage in (stage_name, "pipeline")
        out.append(Check("fit", False if mine else None, ("" if mine else "later in the plan: ")
                         + m.line().split(" — fix: ")[0], m.fix))
    return out


def input_origins(lab, stage: StageConfig, inputs: list[str]) -> dict[str, str]:
    """For each input some stage writes: where it is made, and how it gets to this stage's host."""
    out = {}
    for path in inputs:
        for name, s in lab.cfg.stages.items():
            if s.kind != "job" or name == stage.name:
                continue
            outs = [lab.cfg.render(s, o, lab.cfg.vars_for(s)) for o in s.outputs]
            if not any(placement.under(path, o) for o in outs):
                continue
            move = next((d for d in stage.depends_on if (lab.cfg.stage(d).transfer or None) is not None
                         and lab.cfg.stage(d).transfer.producer == name), None)
            if s.host == stage.host:
                out[path] = f"{path} is made by stage {name!r} on this host: `lab run {name}`"
            elif move:
                out[path] = (f"{path} is made by stage {name!r} on {s.host!r} and moved here by "
                             f"`lab run {move}` (after {name})")
            else:
                fs = placement.filesystems(lab.cfg.host(s.host), path) & placement.filesystems(lab.cfg.host(stage.host), path)
                out[path] = (f"{path} is made by stage {name!r} on {s.host!r}, on filesystem {sorted(fs)[0]!r} "
                             f"that {s.host} and {stage.host} declare shared: run {name}, or check the mount on "
                             f"{stage.host}" if fs else f"{path} is made by stage {name!r} on {s.host!r}")
            break
    return out


def before_launch(lab, stage: StageConfig, spec: dict) -> None:
    """The hook in Lab.run: raise StageError naming the failed checks and their fixes."""
    if os.environ.get("EAGLELAB_NO_PREFLIGHT") == "1":
        return
    failed = [c for c in run(lab, stage.name, spec) if c.ok is False]
    if failed:
        raise StageError(f"preflight failed for stage {stage.name!r} on {stage.host!r}:\n  "
                         + "\n  ".join(c.line() for c in failed)
                         + f"\n(`lab preflight {stage.name}` shows every check; "
                           f"EAGLELAB_NO_PREFLIGHT=1 skips them)")


def as_dicts(checks: list[Check]) -> list[dict]:
    return [{**asdict(c), "verdict": c.verdict} for c in checks]
