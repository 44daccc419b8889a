"""vLLM's lifecycle and its periodic stats lines, as events.

Startup, in order: `Starting to load model` -> `Loading safetensors checkpoint shards` bar ->
`Loading weights took 24.84 seconds` / `Model loading took 12.66 GiB memory and 31.66 seconds` ->
torch.compile (`Dynamo bytecode transform time`, `torch.compile takes 3.70 s in total`) ->
KV cache (`Available KV cache memory`, `# cuda blocks`) -> `Capturing CUDA graphs` ->
`Graph capturing finished in 12 secs` -> `init engine ... took 30.1 seconds` ->
`Application startup complete.` (ready). Shutdown: `Shutting down`, `Application shutdown complete.`
(which is NOT startup). Stats every few seconds:
`Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 37.6 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 53.7%, ...`
and `SpecDecoding metrics: Mean acceptance length: 4.00, ... Avg Draft acceptance rate: 100.0%`.
"""

from __future__ import annotations

import re

from .events import END, READY, Event, metric, num, phase_end, phase_start

_TOOK_RE = re.compile(r"Loading (?:model )?weights took (?P<v>[\d.]+) (?P<u>seconds|GB|GiB)")
_MODEL_LOADING_RE = re.compile(r"Model loading took [\d.]+ Gi?B(?: memory)? and (?P<s>[\d.]+) seconds")
_COMPILE_DONE_RE = re.compile(r"torch\.compile takes (?P<s>[\d.]+) s in total")
_GRAPH_DONE_RE = re.compile(r"Graph capturing finished in (?P<s>[\d.]+) sec")
_INIT_DONE_RE = re.compile(r"init engine \(.*\) took (?P<s>[\d.]+) s")
_STATS_RE = re.compile(r"Avg prompt throughput: (?P<p>[\d.]+) tokens/s, Avg generation throughput: (?P<g>[\d.]+) tokens/s")
_RUNNING_RE = re.compile(r"Running: (\d+) reqs")
_WAITING_RE = re.compile(r"(?:Waiting|Pending): (\d+) reqs")
_KV_RE = re.compile(r"KV cache usage: ([\d.]+)%")
_SPEC_RE = re.compile(r"Mean acceptance length: (?P<len>[\d.]+)(?:.*?Avg Draft acceptance rate: (?P<rate>[\d.]+)%)?")
_SPEC_OLD_RE = re.compile(r"Draft acceptance rate: (?P<rate>[\d.]+)")

# Cheap gate: a line without any of these words cannot be a vLLM lifecycle line.
_GATE = ("took", "takes", "load", "Load", "Application", "Capturing", "capturing", "throughput", "acceptance",
         "Shutting", "KV cache", "Dynamo", "Starting", "Started")
_GATE_RE = re.compile("|".join(re.escape(g) for g in _GATE))


def recognize(msg: str) -> list[Event]:
    if _GATE_RE.search(msg) is None:
        return []
    if "Application startup complete" in msg:
        return [phase_start("serving"), Event(READY)]
    if "Application shutdown complete" in msg:
        return [phase_end("shutdown"), Event(END, "shutdown", message=msg.strip())]
    if msg.startswith("Shutting down") or "Shutting down FastAPI" in msg:
        return [phase_start("shutdown")]
    m = _STATS_RE.search(msg) if "throughput:" in msg else None
    if m:
        rest = msg[m.end():]
        prompt, gen = float(m.group("p")), float(m.group("g"))
        out = [metric("vllm/prompt_tokens_per_s", prompt), metric("vllm/gen_tokens_per_s", gen)]
        r, w, kv = _RUNNING_RE.search(rest), _WAITING_RE.search(rest), _KV_RE.search(rest)
        running = int(r.group(1)) if r else None
        if running is not None:
            out.append(metric("vllm/running_reqs", float(running)))
        if w:
            out.append(metric("vllm/waiting_reqs", float(w.group(1))))
        if kv:
            out.append(metric("vllm/kv_cache_usage_pct", float(kv.group(1))))
        stuck = running is not None and running > 0 and prompt == 0 and gen == 0
        out.append(Event("stall_hint", value=stuck, message=msg.strip()))
        return out
    if "acceptance" in msg:
        m = _SPEC_RE.search(msg)
        if m:
            out = [metric("spec/mean_acceptance_length", float(m.group("len")))]
            if m.group("rate"):
                out.append(metric("spec/acceptance_rate_pct", float(m.group("rate"))))
            return out
        m = _SPEC_OLD_RE.search(msg)
        if m:
            return [metric("spec/acceptance_rate_pct", 100 * float(m.group("rate")))]
        return []
    if "Starting to load model" in msg:
        return [phase_start("weights_loading")]
    m = _TOOK_RE.search(msg)
    if m:
        return [phase_end("weights_loading", num(m.group("v")) if m.group("u") == "seconds" else None)]
    m = _MODEL_LOADING_RE.search(msg)
    if m:
        return [phase_end("weights_loading")]
    if "Dynamo bytecode transform time" in msg or "Start compiling" in msg:
        return [phase_start("compiling")]
    m = _COMPILE_DONE_RE.search(msg)
    if m:
        return [phase_end("compiling", num(m.group("s")))]
    if "Capturing CUDA graph" in msg or "Capturing cudagraphs" in msg:
        return [phase_start("cuda_graph_capture")]
    m = _GRAPH_DONE_RE.search(msg)
    if m:
        return [phase_end("cuda_graph_capture", num(m.group("s")))]
    m = _INIT_DONE_RE.search(msg)
    if m:
        return [phase_end("engine_init", num(m.group("s")))]
    if "Starting vLLM API server" in msg or msg.startswith("Started server process"):
        return [phase_start("api_server_starting")]
    if "Available KV cache memory" in msg or "Memory profiling takes" in msg:
        return [phase_start("engine_init")]
    return []


# Progress bars whose label names a phase of vLLM's startup.
BAR_PHASES = {
    "Loading safetensors checkpoint shards": "weights_loading",
    "Loading pt checkpoint shards": "weights_loading",
    "Loading checkpoint shards": "weights_loading",
    "Capturing CUDA graphs": "cuda_graph_capture",
    "Capturing CUDA graph shapes": "cuda_graph_capture",
}
