"""GPU memory per GPU, by arithmetic on the model's shape: a vLLM server, and the drafter's training.

Training (speculators' EAGLE-3 drafter: one llama-style layer over the verifier's hidden states),
every term checked against the train stage measured at Kimi-K2.5's size on an H200 (issue 29,
bench/results/gpu_train_real_h200.json; bench/bench_plan.py prints the comparison):

  trainable   fc (3H -> H), attention (2H -> q/k/v, o), MLP (3 x H x I): float32
  at rest     parameters + gradients + optimizer state (speculators' Muon: one float32 buffer per
              parameter; measured 11.56 GiB at rest at every length = this arithmetic within 1%)
              + the frozen verifier embeddings and the two draft-vocabulary heads in bf16
  a step      + bf16 copies of the trainable weights (autocast) + activations per token: per TTT step
              the layer's bf16 tensors (4H + q + k + v + 3I) and the draft vocabulary's float32 logits,
              target probabilities and log-probabilities (3 x Vd x 4 B)
  estimate    the offline acceptance: + a bf16 drafter copy (frozen weights included), the verifier's
              full lm_head in bf16, a 2,048-position chunk of its logits, and per token the hidden
              states and the draft logits of its k steps
  the device  allocated x 1.15 (torch's cache: reserved ran 5-18% above allocated) + 2.5 GiB of
              CUDA context and workspaces (device used - reserved, measured)
"""

from __future__ import annotations

from dataclasses import dataclass

from .facts import BF16, Figure, ModelFacts

GIB = 2 ** 30
FP32 = 4
OPTIMIZER_STATES = 1          # speculators' Muon: a momentum buffer per parameter (measured at rest)
RESERVED_FACTOR = 1.15        # torch's caching allocator over allocated (measured 1.05-1.18, issue 29)
CUDA_CONTEXT_GIB = 2.5        # device used beyond reserved: context, cuBLAS/cuDNN workspaces (issue 29)
LOGIT_CHUNK = 2048            # positions of the verifier's logits the estimate holds at once (train stage)
SERVE_MARGIN_GIB = 3.0        # vLLM: CUDA graphs + its profile run's activation peak (a prior)


@dataclass(frozen=True)
class GpuMemory:
    """One process's memory on one GPU: the parts (GiB, each with its source) and the peak."""
    what: str
    parts: tuple[tuple[str, Figure], ...]
    peak_allocated_gib: float     # what torch.cuda.max_memory_allocated would say (training)
    device_gib: float             # what the GPU must have free for it

    def as_dict(self) -> dict:
        return {"what": self.what, "peak_allocated_gib": round(self.peak_allocated_gib, 2),
                "device_gib": round(self.device_gib, 2),
                "parts": [{"name": n, "gib": round(f.value, 3), "source": f.source, "note": f.note}
                          for n, f in self.parts]}


@dataclass(frozen=True)
class DrafterShape:
    trainable: int   # parameters trained (float32)
    frozen: int      # verifier embeddings + lm_head + verifier_lm_head (bf16 on the GPU)


def drafter_shape(m: ModelFacts, draft_vocab: int) -> DrafterShape:
    """The parameters of speculators' one-layer EAGLE-3 drafter built on this verifier."""
    h, i = m.hidden_size, m.intermediate_size
    q, kv = m.heads * m.attn_head_dim, m.kv * m.attn_head_dim
    fc = 3 * h * h
    attention = 2 * h * q + 2 * (2 * h * kv) + q * h   # the layer reads [embeddings; hidden] (2H)
    mlp = 3 * h * i
    norms = 4 * h
    return DrafterShape(trainable=fc + attention + mlp + norms,
                        frozen=m.vocab_size * h + 2 * draft_vocab * h)


def activation_bytes_per_token(m: ModelFacts, draft_vocab: int, ttt_steps: int) -> int:
    h, i = m.hidden_size, m.intermediate_size
    q, kv = m.heads * m.attn_head_dim, m.kv * m.attn_head_dim
    return ttt_steps * (BF16 * (4 * h + q + 2 * kv + 3 * i) + FP32 * 3 * draft_vocab)


def attention_scores_bytes(m: ModelFacts, seq_len: int, ttt_steps: int) -> int:
    """sdpa's math path (the train stage's attention on CPU) keeps each TTT step's score matrix for the
    backward pass, bf16: at step k the queries see the sample and the k draft steps before (T x T(k+1)) for
    every head. Flex attention (on a GPU, compiled) keeps none of it."""
    return sum(seq_len * seq_len * (k + 1) for k in range(ttt_steps)) * m.heads * BF16


def train_gpu(m: ModelFacts, draft_vocab: int, seq_len: int, ttt_steps: int = 3, aux_layers: int = 3,
              estimate: bool = True, what: str = "train", attention: str = "flex") -> GpuMemory:
    """The drafter's training on one GPU at `seq_len` tokens a step; with `estimate`, the offline
    acceptance estimate after each epoch too (its peak counts when above the step's). `attention`:
    flex (a GPU) | sdpa (the stage's choice on CPU: the score matrices kept, quadratic in seq_len)."""
    d = drafter_shape(m, draft_vocab)
    ar = "arithmetic"
    parts = [
        ("drafter parameters (float32)", Figure(d.trainable * FP32 / GIB, ar, f"{d.trainable / 1e6:,.0f} M")),
        ("gradients (float32)", Figure(d.trainable * FP32 / GIB, ar)),
        ("optimizer state (Muon: 1 buffer)", Figure(d.trainable * FP32 * OPTIMIZER_STATES / GIB, ar)),
        ("frozen embeddings + lm_heads (bf16)", Figure(d.frozen * BF16 / GIB, ar,
                                                       f"{m.vocab_size:,} + 2 x {draft_vocab:,} rows x {m.hidden_size}")),
    ]
    rest = sum(f.value for _, f in parts)
    per_token = activation_bytes_per_token(m, draft_vocab, ttt_steps)
    step = [("autocast bf16 weight copies", Figure(d.trainable * BF16 / GIB, ar)),
            (f"activations at {seq_len:,} tokens", Figure(seq_len * per_token / GIB, ar,
                                                          f"{per_token / 1024:,.0f} KiB a token, {ttt_steps} TTT steps"))]
    if attention == "sdpa":
        step.append(("attention scores (sdpa, kept)", Figure(attention_scores_bytes(m, seq_len, ttt_steps) / GIB, ar,
                                                              f"{ttt_steps} TTT steps x T x T(k+1) x {m.heads} heads")))
    step_peak = rest + sum(f.value for _, f in step)
    parts += step
    peak = step_peak
    if estimate:
        est = [("estimate: bf16 drafter copy", Figure((d.trainable + d.frozen) * BF16 / GIB, ar)),
               ("estimate: verifier lm_head (bf16)", Figure(m.vocab_size * m.hidden_size * BF16 / GIB, ar)),
               ("estimate: logits chunk", Figure(min(LOGIT_CHUNK, seq_len) * m.vocab_size * BF16 / GIB, ar,
                                                 f"{min(LOGIT_CHUNK, seq_len)} positions")),
               ("estimate: states + draft logits", Figure(seq_len * ((aux_layers + 1) * m.hidden_size * BF16
                                                                    + ttt_steps * draft_vocab * FP32) / GIB, ar))]
        est_peak = rest + sum(f.value for _, f in est)
        parts += est
        peak = max(step_peak, est_peak)
    parts.append(("torch cache + CUDA context", Figure(peak * (RESERVED_FACTOR - 1) + CUDA_CONTEXT_GIB, "measured",
                                                       "reserved/allocated 1.15 + 2.5 GiB (issue 29, H200)")))
    return GpuMemory(what, tuple(parts), peak, peak * RESERVED_FACTOR + CUDA_CONTEXT_GIB)


def train_phases(m: ModelFacts, draft_vocab: int, tokens: int, ttt_steps: int = 3, aux_layers: int = 3,
                 attention: str = "flex") -> dict:
    """Peak allocated GiB per phase at `tokens` in the largest step (what a measurement reports)."""
    mem = train_gpu(m, draft_vocab, tokens, ttt_steps, aux_layers, attention=attention)
    f = dict(mem.parts)
    rest = sum(f[k].value for k in ("drafter parameters (float32)", "gradients (float32)",
                                    "optimizer state (Muon: 1 buffer)", "frozen embeddings + lm_heads (bf16)"))
    steps = rest + sum(v.value for k, v in f.items() if k.startswith(("autocast", "activations", "attention")))
    est = rest + sum(v.value for k, v in f.items() if k.startswith("estimate"))
    return {"rest": rest, "steps": steps, "estimate": est}


@dataclass(frozen=True)
class ServeMemory:
    gpu: GpuMemory
    kv_cache_gib: float
    kv_tokens: int            # tokens the KV cache holds
    sequences: float          # of max_model_len each


def serve_gpu(m: ModelFacts, tp: int, utilization: float, gpu_gib: float, max_model_len: int,
              what: str = "serve") -> ServeMemory:
    """A vLLM server on one of its `tp` GPUs: it takes `utilization` of the GPU; the weights' share and
    a margin come first, the KV cache gets the rest."""
    held = utilization * gpu_gib
    weights = m.weight_bytes / tp / GIB
    kv = held - weights - SERVE_MARGIN_GIB
    per_tok = m.kv_bytes_per_token(tp)
    tokens = int(max(kv, 0) * GIB / per_tok) if per_tok else 0
    parts = (("weights / TP", Figure(weights, "arithmetic", f"{m.weight_bytes / 1e9:,.0f} GB / {tp}")),
             ("CUDA graphs + activations", Figure(SERVE_MARGIN_GIB, "prior", "vLLM's profile run; its log says")),
             ("KV cache", Figure(kv, "arithmetic", f"{utilization} x {gpu_gib} GiB - the above; "
                                                   f"{per_tok / 1024:,.1f} KiB a token"
                                                   + (" (MLA latent, every rank)" if m.mla else ""))))
    gpu = GpuMemory(what, parts, held, held)
    return ServeMemory(gpu, kv, tokens, tokens / max_model_len if max_model_len else 0.0)
