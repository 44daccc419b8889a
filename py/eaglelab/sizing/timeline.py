"""The pipeline on paper: each stage's GPUs, GPU memory, host RAM, disk and time, laid end to end in the
order `lab pipeline` runs them, with what else is on the GPUs at the time; and what does not fit.

Pure: the controller (eaglelab.control.pipeline.fit) turns the config into `StageSpec`s and `Settings`; this
module only does arithmetic. The rules it follows are the pipeline's own (docs/stages.md): jobs one
after another; a job's services started before it (a service that needs GPUs another holds stops that
one first); a job with `gpus:` gets them to itself (services on them are stopped first); a side job
(`during:`) runs beside its stage; a job with `gpus: 0` that computes on `cuda` shares GPU 0 with
whatever service is up (the kimi-k2.5 pilot beside serve_extract).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .facts import BF16, Facts, Figure
from .memory import GIB, GpuMemory, drafter_shape, serve_gpu, train_gpu

JSONL_BYTES_PER_TOKEN = 4.5     # synth's rows: text ~4 bytes a token + JSON (a prior)
PREPARED_BYTES_PER_TOKEN = 16   # input_ids + loss_mask as int64 (a prior)
MEASURED_RANGE = (0.75, 1.5)    # a rate measured on another GPU than the one planned on


@dataclass(frozen=True)
class PriorNumbers:
    per_s: float
    fixed_s: float
    size: float | None          # units (the prior's limit/expected; None: unknown offline)
    times: float = 1.0
    spread: float = 3.0
    unit: str = ""


@dataclass(frozen=True)
class StageSpec:
    name: str
    kind: str                   # job | service
    host: str
    role: str                   # serve | synth | eval | prepare | vocab | extract | train | pilot | smoke | other
    gpus: int = 0               # GPUs held to itself (services on them are stopped first)
    needs: tuple[str, ...] = ()
    beside: str | None = None   # a side job: runs while this stage runs
    flags: dict = field(default_factory=dict)   # its command's `--flag value` pairs, rendered
    prior: PriorNumbers | None = None
    after_data_part: bool = False  # a pilot whose data part ran in a stage before it (pilot_window: own)


@dataclass(frozen=True)
class Settings:
    host_gpus: dict             # host -> GPUs it has
    samples: float              # synth_limit: rows the pipeline makes
    aux_layers: int = 3
    draft_vocab: int = 32000
    budget_s: float | None = None


@dataclass(frozen=True)
class StageEstimate:
    stage: str
    kind: str
    host: str
    role: str
    gpus: str                           # what it holds, in words
    seconds: Figure                     # the middle of the range
    low_s: float
    high_s: float
    start_s: float = 0.0
    end_s: float = 0.0
    gpu: GpuMemory | None = None        # per GPU
    kv: str = ""                        # a server's KV cache in words
    ram_gib: Figure | None = None
    disk_bytes: Figure | None = None
    beside: tuple[str, ...] = ()        # what else is on its GPUs (or beside it) then

    def as_dict(self) -> dict:
        return {"stage": self.stage, "kind": self.kind, "host": self.host, "role": self.role, "gpus": self.gpus,
                "seconds": round(self.seconds.value), "range_s": [round(self.low_s), round(self.high_s)],
                "time_source": self.seconds.source, "time_note": self.seconds.note,
                "start_s": round(self.start_s), "end_s": round(self.end_s),
                "gpu_memory": self.gpu.as_dict() if self.gpu else None, "kv_cache": self.kv,
                "ram_gib": _fig(self.ram_gib), "disk_bytes": _fig(self.disk_bytes), "beside": list(self.beside)}


def _fig(f: Figure | None) -> dict | None:
    return None if f is None else {"value": round(f.value, 3), "source": f.source, "note": f.note}


@dataclass(frozen=True)
class Misfit:
    stage: str
    what: str                   # gpu | disk | time
    estimate: float
    capacity: float
    unit: str
    detail: str
    fix: str

    def line(self) -> str:
        return (f"{self.stage}: {self.what} {self.estimate:,.1f} {self.unit} > {self.capacity:,.1f} {self.unit}: "
                f"{self.detail} — fix: {self.fix}")

    def as_dict(self) -> dict:
        return {"stage": self.stage, "what": self.what, "estimate": round(self.estimate, 2),
                "capacity": round(self.capacity, 2), "unit": self.unit, "detail": self.detail, "fix": self.fix,
                "line": self.line()}


@dataclass(frozen=True)
class Plan:
    stages: tuple[StageEstimate, ...]
    misfits: tuple[Misfit, ...]
    total_s: float
    facts_source: str
    first_forecast: StageEstimate | None = None  # the pilot whose end brings the first acceptance forecast

    def as_dict(self) -> dict:
        first = self.first_forecast
        return {"facts": self.facts_source, "total_s": round(self.total_s),
                "first_forecast": None if first is None else {"stage": first.stage, "at_s": round(first.end_s)},
                "stages": [s.as_dict() for s in self.stages], "misfits": [m.as_dict() for m in self.misfits],
                "fits": not self.misfits}


def beside_order(order: list[str], beside: dict[str, str]) -> list[str]:
    """Pure: each side job right after the stage it runs beside (when that one is in the plan)."""
    out = [n for n in order if n not in beside]
    for side in [n for n in order if n in beside]:
        at = out.index(beside[side]) + 1 if beside[side] in out else len(out)
        while at < len(out) and out[at] in beside:
            at += 1
        out.insert(at, side)
    return out


def _num(flags: dict, key: str, default: float) -> float:
    try:
        return float(flags.get(key, default))
    except (TypeError, ValueError):
        return default


def on_gpu(spec: StageSpec, host_gpu_gib: float | None) -> bool:
    """Does this job compute on a GPU itself? cuda, or auto where the host has GPUs."""
    device = str(spec.flags.get("device", "auto"))
    return device.startswith("cuda") or (device == "auto" and host_gpu_gib is not None)


def prior_time(spec: StageSpec) -> tuple[Figure, float, float]:
    p = spec.prior
    if p is None or p.size is None:
        return Figure(0.0, "unknown", "no prior with a size"), 0.0, 0.0
    mid = p.size * p.times / p.per_s + p.fixed_s
    note = f"{p.size:,.0f} {p.unit} x {p.times:g} at {p.per_s:g}/s + {p.fixed_s:g} s (the profile's prior)"
    return Figure(mid, "prior", note), mid / p.spread, mid * p.spread


def train_time(spec: StageSpec, facts: Facts, samples: float, epochs: float) -> tuple[Figure, float, float]:
    rate = facts.rates.get("train_tokens_per_s")
    tokens = facts.workload.get("sample_tokens")
    if rate is None or tokens is None:
        return prior_time(spec)
    fixed = facts.rates.get("train_fixed_s", Figure(0, "prior")).value
    per_epoch = facts.rates.get("train_epoch_s", Figure(0, "prior")).value
    mid = epochs * samples * tokens.value / rate.value + fixed + epochs * per_epoch
    note = (f"{epochs:g} epochs x {samples:,.0f} samples x {tokens.value:,.0f} tokens at {rate.value:,.0f} tokens/s "
            f"({rate.source}: {rate.note}) + {fixed:g} s + {per_epoch:g} s an epoch")
    return Figure(mid, "measured rate x arithmetic", note), mid * MEASURED_RANGE[0], mid * MEASURED_RANGE[1]


def eval_time(spec: StageSpec, facts: Facts) -> tuple[Figure, float, float] | None:
    """The serving sweep: every concurrency x repeat x decoding (greedy, and sampled when the temperature
    is > 0), each cell `limit` requests of `max-tokens`, at a decode rate of min(c x one stream's, the
    server's most); None without those rates."""
    one, most = facts.rates.get("decode_tokens_per_s"), facts.rates.get("decode_tokens_per_s_max")
    if one is None or most is None:
        return None
    f = spec.flags
    levels = [int(c) for c in str(f.get("concurrency", "1")).split()]
    sides = 2 if _num(f, "temperature", 0) > 0 else 1
    limit, tokens, repeats = _num(f, "limit", 64), _num(f, "max-tokens", 256), _num(f, "repeats", 1)
    rounds = _num(f, "rounds", 0)
    # the eval stage's cell_requests: every prompt, or `rounds` waves of the cell's concurrency
    requests = {c: limit if rounds <= 0 else min(limit, rounds * c) for c in levels}
    cells = {c: requests[c] * tokens / min(c * one.value, most.value) for c in levels}
    mid = sum(cells.values()) * repeats * sides
    per_cell = f"{limit:g} requests" if rounds <= 0 else f"{rounds:g} x concurrency requests (at most {limit:g})"
    note = (f"{len(levels)} concurrencies x {repeats:g} repeats x {sides} decodings, {per_cell} of "
            f"{tokens:g} tokens a cell, at min(c x {one.value:g}, {most.value:g}) tokens/s ({one.source}: {one.note}); "
            f"concurrency {levels[0]} alone {cells[levels[0]] * repeats * sides / 3600:.1f} h")
    return Figure(mid, "prior rate x arithmetic", note), mid / 2, mid * 2


def estimate_stage(spec: StageSpec, facts: Facts, st: Settings) -> StageEstimate:
    """One stage on its own: its time, GPU memory per GPU, RAM and disk (not yet placed in time)."""
    m, f = facts.model, spec.flags
    gpu_gib = facts.host(spec.host).gpu_memory_gib
    tokens = facts.workload.get("sample_tokens")
    seconds, low, high = prior_time(spec)
    gpu, kv, ram, disk = None, "", None, None
    held = str(spec.gpus) if spec.gpus else "0"
    if spec.role == "serve":
        tp = int(_num(f, "tensor-parallel", 1))
        held = f"{spec.gpus} (TP {tp})" if spec.gpus else "0 (cpu)"
        ram = Figure(4.0 * tp, "prior", "a vLLM worker process a GPU")
        if gpu_gib is not None and str(f.get("device", "auto")) != "cpu":
            s = serve_gpu(m, tp, _num(f, "gpu-memory-utilization", 0.9), gpu_gib,
                          int(_num(f, "max-model-len", 0)), what=spec.name)
            gpu = s.gpu
            kv = f"{max(s.kv_cache_gib, 0):.1f} GiB: {s.kv_tokens:,} tokens, {s.sequences:.1f} x max-model-len"
    elif spec.role == "pilot" and str(f.get("through", "train")) != "train":
        # the pilot's data part (pilot_window: own): its samples' hidden states, no train on a GPU
        if tokens is not None:
            disk = Figure(_num(f, "samples", 0) * tokens.value * (st.aux_layers + 1) * m.hidden_size * BF16,
                          "arithmetic", "its samples' hidden states")
        ram = Figure(2.0, "prior")
    elif spec.role in ("train", "pilot", "smoke"):
        seq = int(_num(f, "total-seq-len", _num(f, "seq-length", 8192)))
        ttt = int(_num(f, "acceptance-k", 3))
        d = drafter_shape(m, st.draft_vocab)
        ram = Figure(8.0 + (d.trainable * 4 + d.frozen * BF16) / GIB * 2, "prior",
                     "the process + the drafter and verifier weights read on the host")
        if on_gpu(spec, gpu_gib) and spec.role != "smoke":
            gpu = train_gpu(m, st.draft_vocab, seq, ttt, st.aux_layers, estimate="acceptance-k" in f, what=spec.name)
            held = f"{spec.gpus}" if spec.gpus else "0 (computes on cuda:0)"
        epochs = _num(f, "epochs", 1)
        n = st.samples if spec.role == "train" else _num(f, "samples", 0) * 0.9
        if spec.role == "train":
            seconds, low, high = train_time(spec, facts, n, epochs)
        if tokens is not None and spec.role != "smoke":
            ckpt = epochs * (d.trainable * 4 * 2 + d.frozen * BF16)
            hs = (_num(f, "samples", 0) * tokens.value * (st.aux_layers + 1) * m.hidden_size * BF16
                  if spec.role == "pilot" and not spec.after_data_part else 0)
            disk = Figure(ckpt + hs, "arithmetic", f"{epochs:g} checkpoints (weights + optimizer state)"
                          + (", its samples' hidden states" if hs else ""))
    elif spec.role == "extract" and tokens is not None:
        n = st.samples * tokens.value
        disk = Figure(n * (st.aux_layers + 1) * m.hidden_size * BF16, "arithmetic",
                      f"{n:,.0f} tokens x {st.aux_layers + 1} layers x {m.hidden_size} x 2 B")
        ram = Figure(2.0, "prior")
    elif spec.role == "synth" and tokens is not None:
        rows = min(st.samples, _num(f, "limit", st.samples))  # synth_head: the pilot's first rows
        disk = Figure(rows * tokens.value * JSONL_BYTES_PER_TOKEN, "prior",
                      f"{JSONL_BYTES_PER_TOKEN} bytes a token of JSONL")
        ram = Figure(2.0, "prior")
    elif spec.role == "prepare" and tokens is not None:
        disk = Figure(st.samples * tokens.value * PREPARED_BYTES_PER_TOKEN, "prior", "input_ids + loss_mask, int64")
        ram = Figure(4.0, "prior")
    elif spec.role == "eval":
        seconds, low, high = eval_time(spec, facts) or (seconds, low, high)
    elif spec.role == "vocab":
        disk = Figure((m.vocab_size + st.draft_vocab) * 8, "arithmetic", "d2t + t2d")
    return StageEstimate(spec.name, spec.kind, spec.host, spec.role, held, seconds, low, high, gpu=gpu, kv=kv,
                         ram_gib=ram, disk_bytes=disk)


def plan(specs: list[StageSpec], facts: Facts, st: Settings) -> Plan:
    """The jobs in `specs`' order (side jobs after their stage), their services started when first
    needed, laid end to end; then every misfit."""
    by_name = {s.name: s for s in specs}
    own = {s.name: estimate_stage(s, facts, st) for s in specs}
    up: dict[str, float] = {}        # service -> when its load began
    placed: dict[str, StageEstimate] = {}
    windows: list[StageEstimate] = []   # every service's every window: one a load
    misfits: list[Misfit] = []
    t = 0.0

    def gpus_of(name: str) -> int:
        return by_name[name].gpus

    def stop_for(host: str, need: int, keep: tuple[str, ...] = ()) -> None:
        total = st.host_gpus.get(host, 0)
        for svc in list(up):
            s = by_name[svc]
            if svc in keep or s.host != host or not s.gpus:
                continue
            if sum(gpus_of(x) for x in up if by_name[x].host == host) + need > total:
                windows.append(_at(own[svc], up.pop(svc), t))

    for s in specs:
        if s.kind != "job":
            continue
        if s.beside and s.beside in placed:
            start = placed[s.beside].start_s
        else:
            for svc in s.needs:
                if svc not in up and svc in by_name:
                    stop_for(by_name[svc].host, gpus_of(svc), keep=s.needs)
                    up[svc] = t
                    t += own[svc].seconds.value
            if s.gpus:
                stop_for(s.host, s.gpus, keep=s.needs)
            start = t
        co = tuple(svc for svc in up if by_name[svc].host == s.host)
        est = _at(own[s.name], start, start + own[s.name].seconds.value, co)
        placed[s.name] = est
        if not s.beside:
            t = est.end_s
        misfits += gpu_misfits(s, est, [own[c] for c in co if by_name[c].gpus], facts)
    for svc, began in up.items():
        windows.append(_at(own[svc], began, t))
    order = sorted([*placed.values(), *windows], key=lambda e: (e.start_s, e.kind != "service"))
    for e in order:
        if e.role == "serve":
            misfits += serve_misfits(e, facts)
    misfits += disk_misfits(order, facts)
    total = max((e.end_s for e in order), default=0.0)
    if st.budget_s and total > st.budget_s:
        worst = max((e for e in order if e.kind == "job"), key=lambda e: e.seconds.value)
        misfits.append(Misfit("pipeline", "time", total / 3600, st.budget_s / 3600, "h",
                              f"the stages end to end (range {sum(e.low_s for e in order if e.kind == 'job') / 3600:.1f}"
                              f"-{sum(e.high_s for e in order if e.kind == 'job') / 3600:.1f} h of jobs); "
                              f"the longest: {worst.stage} {worst.seconds.value / 3600:.1f} h",
                              f"shorten {worst.stage} (its settings, `lab plan --offline` says how its time is "
                              f"made), or raise the profile's plan_budget_h"))
    # the first forecast: a pilot's end (its train's estimates), not a data part that stops before its train
    pilots = [e for e in order if e.role == "pilot" and str(by_name[e.stage].flags.get("through", "train")) == "train"]
    first = min(pilots, key=lambda e: e.end_s, default=None)
    return Plan(tuple(order), tuple(misfits), total, facts.source or facts.model.source, first)


def _at(e: StageEstimate, start: float, end: float, beside: tuple[str, ...] = ()) -> StageEstimate:
    return replace(e, start_s=start, end_s=end, beside=beside or e.beside)


def gpu_misfits(spec: StageSpec, est: StageEstimate, services: list[StageEstimate], facts: Facts) -> list[Misfit]:
    cap = facts.host(spec.host).gpu_memory_gib
    if est.gpu is None or cap is None:
        return []
    if spec.gpus:  # its GPUs are its own: the services on them were stopped
        taken, others = 0.0, []
    else:          # computes on cuda:0, beside whatever holds it
        taken = sum(s.gpu.device_gib for s in services if s.gpu)
        others = [f"{s.stage} (holding {s.gpu.device_gib:.1f} GiB of it)" for s in services if s.gpu]
    free = cap - taken
    if est.gpu.device_gib <= free:
        return []
    if not others:
        return [Misfit(spec.name, "gpu", est.gpu.device_gib, free, "GiB",
                       f"{est.gpu.what} needs {est.gpu.device_gib:.1f} GiB on one GPU of {cap:g} GiB "
                       f"(peak allocated {est.gpu.peak_allocated_gib:.1f} GiB)",
                       "a GPU with more memory or a shorter seq_length")]
    return [Misfit(spec.name, "gpu", est.gpu.device_gib, free, "GiB",
                   f"{est.gpu.what} needs {est.gpu.device_gib:.1f} GiB (peak allocated "
                   f"{est.gpu.peak_allocated_gib:.1f} GiB) on GPU 0, beside {', '.join(others)} "
                   f"({cap:g} GiB a GPU)", beside_fix(spec.name, est.gpu.device_gib, services, facts))]


def beside_fix(name: str, need: float, services: list[StageEstimate], facts: Facts) -> str:
    """Can a lower gpu_memory_utilization of the services make room? Else: another GPU or host."""
    fixes = []
    for s in services:
        cap = facts.host(s.host).gpu_memory_gib or 0.0
        parts = dict(s.gpu.parts)
        util = math.floor((cap - need) / cap * 100) / 100 if cap else 0.0
        floor = parts["weights / TP"].value + parts["CUDA graphs + activations"].value
        if util * cap > floor:
            fixes.append(f"{s.stage}'s gpu_memory_utilization <= {util:.2f} (its KV cache then "
                         f"{util * cap - floor:.1f} GiB)")
        else:
            fixes.append(f"no gpu_memory_utilization of {s.stage} leaves room ({floor:.1f} GiB of weights and "
                         f"margin a GPU)")
    return ("; ".join(fixes) + f": run {name} on another host, or its train where {', '.join(s.stage for s in services)} "
            f"has stopped (a GPU of its own)")


def serve_misfits(e: StageEstimate, facts: Facts) -> list[Misfit]:
    if e.gpu is None:
        return []
    parts = dict(e.gpu.parts)
    kv = parts["KV cache"].value
    if kv > 0:
        return []
    need = parts["weights / TP"].value + parts["CUDA graphs + activations"].value
    return [Misfit(e.stage, "gpu", need, e.gpu.device_gib, "GiB",
                   "weights / TP + margin leave no KV cache within gpu_memory_utilization",
                   "more tensor parallelism, a higher gpu_memory_utilization, or a quantised checkpoint")]


def disk_misfits(order: list[StageEstimate], facts: Facts) -> list[Misfit]:
    out, used = [], {}
    for e in order:
        if e.disk_bytes is None:
            continue
        used[e.host] = used.get(e.host, 0.0) + e.disk_bytes.value
        cap = facts.host(e.host).disk_bytes
        if cap is not None and used[e.host] > cap and not any(m.what == "disk" and m.stage == e.stage for m in out):
            out.append(Misfit(e.stage, "disk", used[e.host] / 1e9, cap / 1e9, "GB",
                              f"the pipeline's outputs on {e.host} up to and including {e.stage}",
                              "free disk on the host, fewer samples, or fewer aux layers"))
            break
    return out
