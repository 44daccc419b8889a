"""Offline acceptance of a drafter checkpoint, from held-out hidden states (no server).

EAGLE-3 drafts k tokens in sequence; greedy verification keeps the drafted tokens up to the first
one that differs from the verifier's own next token. Teacher-forced on the verifier's hidden
states (as speculators trains), the drafter's k steps from every supervised position t give

    correct_s(t) = [draft step s from t == the verifier's argmax at t+s]      s = 0..k-1
    a_s          = mean over t of  correct_0(t) and ... and correct_s(t)       (vLLM's per-position acceptance)

and from those, as vLLM's spec_decode counters report them:

    acceptance_rate        = (a_0 + ... + a_{k-1}) / k
    mean_acceptance_length = 1 + a_0 + ... + a_{k-1}                          (the +1 is the verifier's bonus token)

The verifier's next token is the argmax of its FULL lm_head (not the draft vocabulary's rows): a
token outside the draft vocabulary is a miss, as it is when serving. Held out = speculators' own
validation split (the last 1 - train_data_ratio of the prepared rows), which training never sees.

That average counts a draft from EVERY supervised start t. vLLM drafts from where the last draft
ended: from t it keeps L consecutive right drafts (L <= k), then the verifier's own token at t+L,
and the next draft starts at t+L+1. `chain` replays that walk over the same per-start
correctness (no extra forward pass); its rate and mean length are what vLLM's counters count
when it serves these rows greedily (`chain` in the record; `acceptance/chain_rate` in the log).

Sampled serving (temperature T > 0) verifies by speculative sampling: a drafted token x is kept
with probability sum_y min(p(y), q(y)) over the proposal q, where p is the verifier's distribution
after temperature and top-p (vLLM's rejection sampler). vLLM's EAGLE proposer drafts its argmax
(`draft_sample_method: greedy`, its default, and the only one with a draft vocabulary subset), so
q is a point mass on the drafted token (mapped to the verifier's ids through d2t) and the sum is
p(x): a step is kept with probability p_{t+s}(draft_s(t)). The same prefix products and the same
walk, in expectation, give `sampled` (`acceptance/sampled_rate`), for the eval's temperature and
top-p (`--temperature`, `--top-p`; the pipeline passes eval_temperature and eval_top_p). That expectation
walks the held-out rows' own path: it forecasts sampled serving only when the rows were sampled as the
eval samples (kimi-k2.5's synth; the demo's is greedy), so the train hook marks it `on_policy` (`rows`).

    python -m eaglelab.stages.acceptance --checkpoint data/demo/checkpoints/3 --model data/demo/model \
        --data data/demo/prepared --hidden-states data/demo/hidden_states --k 3 --temperature 1.0 --top-p 0.95
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from pathlib import Path

import click

from .. import manifest

FILE_NAME = "acceptance.jsonl"  # in the train stage's --out, one line per estimated checkpoint
LOG_PREFIX = "acceptance/"      # the metric line's keys (host/parse/speculators.py reads k=v lines)


def summarize(prefix_correct: list[float], starts: int, k: int) -> dict:
    """Rate and mean length from the per-position prefix accuracies a_0..a_{k-1} (pure)."""
    if k < 1:
        raise ValueError(f"k={k}: the number of speculative tokens must be >= 1")
    per_pos = [prefix_correct[s] / starts if starts else 0.0 for s in range(k)]
    accepted = sum(per_pos)
    return {"k": k, "starts": starts, "per_position": per_pos, "acceptance_rate": accepted / k,
            "mean_acceptance_length": 1.0 + accepted}


def held_out_indices(num_rows: int, train_data_ratio: float) -> range:
    """The prepared rows speculators keeps for validation (its ArrowDataset split, same expression)."""
    split = int(num_rows * train_data_ratio)
    return range(split, num_rows)


LOGIT_CHUNK = 2048  # positions per lm_head product: [2048, 163,840] bf16 logits are 0.67 GB, a whole
                   # 18,432-token sample's would be 6 GB (12 GB in float32)


def verifier_next_tokens(last_hidden, norm, lm_head_weight, chunk: int = LOGIT_CHUNK):
    """The verifier's greedy next token at every position: argmax(lm_head(norm(h))) over the full vocab,
    a chunk of positions at a time (dim -2), so the logits of a long sample are never all held."""
    import torch

    with torch.no_grad():
        h = norm(last_hidden).to(lm_head_weight.dtype)
        parts = [torch.nn.functional.linear(c, lm_head_weight).argmax(dim=-1) for c in h.split(chunk, dim=-2)]
    return torch.cat(parts, dim=-1)


def eager():
    """A context with torch.compile off: the estimate runs its drafter eagerly.

    speculators compiles the drafter's forward on a GPU, and dynamo keeps at most `recompile_limit`
    (8) variants of each frame; the draft decoder layer (a graph break inside) gets one per TTT step
    and mode: training's 3, validation's 3 (no grad). An estimate compiled in its own dtype, attention
    and mode added 3 more, so validation's last TTT step found the frame over its limit and ran flex
    attention uncompiled, which materialises the whole score matrix: 243 GiB at 18,432 tokens, an OOM
    at the end of the first epoch. Eager, the estimate adds no variant (tests/test_train_memory.py
    counts them)."""
    import torch

    return torch.compiler.set_stance("force_eager")  # torch >= 2.6 (the pins: 2.13; the GPU image: 2.11)


def valid_starts(loss_mask, k: int, n: int):
    """[n] bool: start t drafts k tokens the verifier made (t..t+k-1 all supervised) (pure tensors)."""
    import torch

    mask = loss_mask.bool()
    valid = torch.ones(n, dtype=torch.bool)
    for s in range(k):
        valid &= mask[s:s + n]
    return valid


def step_matches(draft_target_ids: list, verifier_next, n: int):
    """[k, n] float: 1.0 where the draft of step s from start t is the verifier's argmax at t+s (pure)."""
    import torch

    return torch.stack([(d[:n] == verifier_next[s:s + n]).float() for s, d in enumerate(draft_target_ids)])


def prefix_sums(steps, valid) -> tuple[list[float], int]:
    """Over every valid start t: sum of P(steps 0..s all kept) = prod_{j<=s} steps[j][t], and the number
    of starts (pure). steps: [k, n] probabilities that each step is kept (0/1 when greedy)."""
    keep = valid.to(steps.dtype)
    sums = []
    for s in range(steps.shape[0]):
        keep = keep * steps[s]
        sums.append(float(keep.sum()))
    return sums, int(valid.sum())


def chain(steps, valid) -> tuple[list[float], float]:
    """vLLM's restart chain over one row, in expectation (pure): per-position sums and drafts.

    The walk starts at position 0. At a valid start t a draft is made: step s is kept with probability
    steps[s][t] if steps 0..s-1 were; rejected at step s (L = s kept) or all k kept (L = k), the
    verifier's token at t+L follows and the next draft starts at t+L+1. At a start that is not valid
    (an unsupervised position, or too near a segment's end for k drafts) the walk moves on by one. With
    0/1 steps (greedy) this is the one path vLLM takes; with probabilities it is the expectation over
    independent acceptances (sampled), w[t] the probability the walk drafts at t."""
    steps = steps.tolist() if hasattr(steps, "tolist") else [list(r) for r in steps]
    valid = valid.tolist() if hasattr(valid, "tolist") else list(valid)
    k, n = len(steps), len(valid)
    w = [0.0] * (n + k + 2)
    w[0] = 1.0 if n else 0.0
    sums, drafts = [0.0] * k, 0.0
    for t in range(n):
        m = w[t]
        if m == 0.0:
            continue
        if not valid[t]:
            w[t + 1] += m
            continue
        drafts += m
        kept = 1.0  # P(steps 0..s-1 all kept)
        for s in range(k):
            now = kept * steps[s][t]
            sums[s] += m * now
            w[t + s + 1] += m * (kept - now)  # rejected at step s: s kept, then the verifier's token at t+s
            kept = now
        w[t + k + 1] += m * kept
    return sums, drafts


def prefix_correct_counts(draft_target_ids: list, verifier_next, loss_mask) -> tuple[list[float], int]:
    """Sum over start positions of 'steps 0..s all right', and the number of starts (pure tensors).

    draft_target_ids[s][t]: the token drafted at step s from start t (in the verifier's vocab);
    verifier_next[u]: the verifier's argmax at u; loss_mask[u]: u is a supervised position. A start
    t counts when t..t+k-1 are all supervised (the k tokens it drafts are ones the verifier made)."""
    k = len(draft_target_ids)
    n = verifier_next.shape[-1] - (k - 1)
    if n <= 0:
        return [0.0] * k, 0
    return prefix_sums(step_matches(draft_target_ids, verifier_next, n), valid_starts(loss_mask, k, n))


def target_probs(logits, temperature: float, top_p: float = 1.0):
    """The verifier's sampling distribution as vLLM's rejection sampler sees it (pure): logits / T, then
    top-p as vLLM applies it (ascending sort; the tokens whose cumulative probability stays <= 1 - top_p
    are dropped, the most likely one always kept), softmax over what is left. Rows are positions."""
    import torch

    logits = logits.float() / temperature
    if top_p < 1.0:
        srt, idx = logits.sort(dim=-1, descending=False)
        drop = srt.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop[..., -1] = False
        logits = logits.scatter(-1, idx, srt.masked_fill(drop, float("-inf")))
    return torch.softmax(logits, dim=-1)


SAMPLED_CHUNK = 256  # positions per chunk when probabilities are needed: the sort for top-p holds values and
                     # int64 indices of [chunk, vocab] (0.6 GB at 256 x 163,840)


def step_probs(last_hidden, norm, lm_head_weight, draft_target_ids: list, temperature: float, top_p: float,
               chunk: int = SAMPLED_CHUNK):
    """[k, n]: the probability p_{t+s}(draft_s(t)) that the verifier, sampling at `temperature`/`top_p`,
    keeps the drafted token of step s from start t (vLLM's greedy proposal: q is a point mass, so
    sum_y min(p, q) = p(draft)); n = seq - (k - 1). A chunk of positions at a time, as the argmax."""
    import torch

    k, seq = len(draft_target_ids), last_hidden.shape[-2]
    n = seq - (k - 1)
    idx = torch.zeros(seq, k, dtype=torch.long)
    for s, d in enumerate(draft_target_ids):  # at position u, step s's draft made from start u - s
        idx[s:, s] = d[:seq - s]
    got = []
    with torch.no_grad():
        h = norm(last_hidden).to(lm_head_weight.dtype)
        for i, c in enumerate(h.split(chunk, dim=-2)):
            p = target_probs(torch.nn.functional.linear(c, lm_head_weight), temperature, top_p)
            got.append(p.gather(-1, idx[i * chunk:i * chunk + c.shape[-2]].to(p.device)).cpu())
    got = torch.cat(got, dim=-2)  # [seq, k]
    return torch.stack([got[s:s + n, s] for s in range(k)])


def draft_k(drafter, sample: dict, k: int) -> list:
    """The drafter's k teacher-forced steps over one sample, mapped to verifier token ids."""
    import torch

    device = next(drafter.parameters()).device
    dtype = next(drafter.parameters()).dtype
    seq = sample["input_ids"].shape[0]
    with torch.no_grad():
        drafts = drafter(hidden_states=sample["hidden_states"].unsqueeze(0).to(device, dtype),
                         input_ids=sample["input_ids"].unsqueeze(0).to(device),
                         document_ids=torch.zeros(1, seq, dtype=torch.long, device=device),
                         position_ids=sample["position_ids"].unsqueeze(0).to(device), ttt_steps=k)
    d2t = getattr(drafter, "d2t", None)
    out = []
    for d in drafts:
        d = d[0].cpu()
        out.append(d + d2t.cpu()[d] if d2t is not None else d)  # speculators' d2t holds offsets
    return out


def held_out_samples(data: Path, hidden_states: Path, train_data_ratio: float, max_samples: int | None):
    """(index, sample) for the held-out rows, read and aligned as speculators' trainer does
    (shift_batch: token x_{i+1} with the verifier's hidden state at i, target from i+1)."""
    from hs_connectors import FileTransfer
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset

    ds = ArrowDataset(max_len=1 << 30, datapath=str(data), transfer=FileTransfer(Path(hidden_states)),
                      on_missing="raise", train_ratio=train_data_ratio, split="val")
    n = len(ds) if max_samples is None else min(len(ds), max_samples)
    for i in range(n):
        yield ds.start_file_idx + i, shift_batch(ds[i])


def verifier_lm_head(verifier: Path, device, dtype=None):
    """The verifier's full output projection (its embeddings when they are tied), in `dtype`
    (default float32; training's bf16 on a GPU: the checkpoint's own dtype, half the memory)."""
    import torch
    from speculators.utils.loading import load_model_layers

    try:  # only the one matrix read: Kimi-K2.5's embeddings are 2.3 GB more
        w = load_model_layers(["lm_head.weight"], str(verifier)).get("lm_head.weight")
    except ValueError:  # none of the names found
        w = None
    if w is None:  # tied: the embeddings are the output projection
        w = load_model_layers(["embed_tokens.weight"], str(verifier))["embed_tokens.weight"]
    return w.to(device, dtype or torch.float32)


class Tally:
    """Sums over rows for one way of counting: per-position sums and drafts (or starts)."""

    def __init__(self, k: int):
        self.k, self.sums, self.drafts = k, [0.0] * k, 0.0

    def add(self, sums: list[float], drafts: float) -> None:
        self.sums = [a + b for a, b in zip(self.sums, sums)]
        self.drafts += drafts

    def summary(self) -> dict:
        out = summarize(self.sums, self.drafts, self.k)
        out["drafts"] = round(out.pop("starts"), 3)
        return out


def estimate(drafter, lm_head, samples, k: int, temperature: float = 0.0, top_p: float = 1.0) -> dict:
    """The acceptance summary of `drafter` over (index, sample) pairs (its mode is restored after):
    every start (the top-level figures), vLLM's greedy chain (`chain`) and, with temperature > 0,
    speculative sampling's expectation (`sampled`: its chain, and `all_starts`)."""
    device = next(drafter.parameters()).device
    norm = drafter.verifier_norm
    was_training = drafter.training
    drafter.eval()
    sums, starts, used = [0.0] * k, 0, []
    greedy_chain, sampled_chain, sampled_all = Tally(k), Tally(k), Tally(k)
    try:
        for idx, sample in samples:
            drafts = draft_k(drafter, sample, k)
            last = sample["verifier_last_hidden_states"].to(device, norm.weight.dtype)
            nxt = verifier_next_tokens(last, norm, lm_head).cpu()
            n = nxt.shape[-1] - (k - 1)
            used.append(idx)
            if n <= 0:
                continue
            valid = valid_starts(sample["loss_mask"], k, n)
            matches = step_matches(drafts, nxt, n)
            s, c = prefix_sums(matches, valid)
            sums = [a + b for a, b in zip(sums, s)]
            starts += c
            greedy_chain.add(*chain(matches, valid))
            if temperature > 0:
                probs = step_probs(last, norm, lm_head, drafts, temperature, top_p)
                sampled_all.add(*prefix_sums(probs, valid))
                sampled_chain.add(*chain(probs, valid))
    finally:
        drafter.train(was_training)
    doc = {**summarize(sums, starts, k), "samples": len(used), "held_out": used, "chain": greedy_chain.summary(),
           "sampled": None}
    if temperature > 0:
        doc["sampled"] = {"temperature": temperature, "top_p": top_p, **sampled_chain.summary(),
                          "all_starts": sampled_all.summary()}
    return doc


def record(out_dir: Path, doc: dict) -> dict:
    """Append one estimate to <out>/acceptance.jsonl (flushed: the tailer and page read it live)."""
    doc = {"at": time.time(), **doc}
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / FILE_NAME, "a") as f:
        f.write(json.dumps(doc) + "\n")
        f.flush()
    return doc


def log_line(doc: dict) -> str:
    """`acceptance/rate=0.4123, acceptance/mean_length=2.237, acceptance/pos_0=..., acceptance/chain_rate=...,
    acceptance/chain_mean_length=..., [acceptance/sampled_rate=..., acceptance/sampled_mean_length=..., [acceptance/sampled_on_policy=0|1,]]
    global_step=N` (a metric line)."""
    parts = [f"{LOG_PREFIX}rate={doc['acceptance_rate']:.4f}", f"{LOG_PREFIX}mean_length={doc['mean_acceptance_length']:.4f}"]
    parts += [f"{LOG_PREFIX}pos_{i}={p:.4f}" for i, p in enumerate(doc["per_position"])]
    for name in ("chain", "sampled"):  # vLLM's greedy chain; speculative sampling's expected chain
        if isinstance(doc.get(name), dict):
            parts += [f"{LOG_PREFIX}{name}_rate={doc[name]['acceptance_rate']:.4f}",
                      f"{LOG_PREFIX}{name}_mean_length={doc[name]['mean_acceptance_length']:.4f}"]
    if isinstance(doc.get("sampled"), dict) and isinstance(doc["sampled"].get("on_policy"), bool):
        parts.append(f"{LOG_PREFIX}sampled_on_policy={int(doc['sampled']['on_policy'])}")  # mark_policy's word
    if doc.get("epoch") is not None:
        parts.append(f"epoch={doc['epoch']}")
    if doc.get("global_step") is not None:
        parts.append(f"global_step={doc['global_step']}")
    return ", ".join(parts)


def describe(doc: dict) -> str:
    """The forecasts calibrated to vLLM's drafting, in words: greedy chain, sampled chain."""
    out = []
    if isinstance(doc.get("chain"), dict):
        out.append(f"as vLLM drafts greedily {doc['chain']['acceptance_rate']:.1%} / "
                   f"{doc['chain']['mean_acceptance_length']:.2f}")
    sd = doc.get("sampled")
    if isinstance(sd, dict):
        off = sd.get("rows") if sd.get("on_policy") is False else None
        out.append(f"sampled at T={sd['temperature']:g}, top-p {sd['top_p']:g}: {sd['acceptance_rate']:.2%} / "
                   f"{sd['mean_acceptance_length']:.2f}"
                   + (f" (off-policy: the rows were drawn at T={off['temperature']:g}, top-p {off['top_p']:g})"
                      if off else ""))
    return "; ".join(out)


def read(out_dir: Path) -> list[dict]:
    """The estimates written so far (a torn last line is skipped: it is still being written)."""
    path = Path(out_dir) / FILE_NAME
    if not path.is_file():
        return []
    docs = []
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and isinstance(d.get("acceptance_rate"), (int, float)):
            docs.append(d)
    return docs


def rows_sampling(data: Path) -> dict | None:
    """How the held-out rows were generated: {temperature, top_p} of the synth run that prepare read (its
    manifest's inputs -> that directory's synth manifest), None where that cannot be told."""
    if data is None:  # rows handed over without their folder (tests that stub the loaders)
        return None
    doc = manifest.read(data) or {}
    for src in (doc.get("params") or {}).get("inputs") or {}:
        sampling = ((manifest.read(Path(src).parent) or {}).get("params") or {}).get("sampling")
        if isinstance(sampling, dict) and isinstance(sampling.get("temperature"), (int, float)):
            return {"temperature": float(sampling["temperature"]), "top_p": float(sampling.get("top_p", 1.0))}
    return None


def mark_policy(doc: dict, rows: dict | None) -> dict:
    """Say in the sampled forecast whether its rows were drawn as the eval samples (`on_policy`). The
    expectation is taken on the rows' own path: on greedy rows it is the sampled acceptance along the
    greedy path, where a drafter trained on greedy rows does best (the demo: 16.0% there, 7.2% on the
    eval prompts' sampled answers; docs/foresight.md)."""
    sd = doc.get("sampled")
    if isinstance(sd, dict) and rows is not None:
        sd["rows"] = rows
        sd["on_policy"] = rows["temperature"] == sd["temperature"] and rows["top_p"] == sd["top_p"]
    return doc


def load_checkpoint(checkpoint: Path, device: str = "cpu", dtype=None):
    """A saved drafter, its verifier-owned weights (embeddings, norm) loaded as serving would, in
    `dtype` (default float32; the train hook passes training's bf16 on a GPU)."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel

    cfg_path = checkpoint / "config.json"
    if not cfg_path.is_file():
        raise click.ClickException(f"{checkpoint}: no config.json; point --checkpoint at an epoch directory "
                                   "(<train out>/<epoch>/) with config.json and model.safetensors")
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    # sdpa everywhere: flex attention's block masks want the trainer's padded lengths, and a
    # dense mask over a few held-out rows is cheap.
    cfg = Eagle3SpeculatorConfig.from_pretrained(str(checkpoint))
    cfg.transformer_layer_config._attn_implementation = "sdpa"
    drafter = Eagle3DraftModel.from_pretrained(str(checkpoint), config=cfg)
    drafter.load_verifier_weights()
    return drafter.to(device, dtype or torch.float32)


def estimate_checkpoint(ckpt: Path, verifier: Path, data: Path, hidden_states: Path, train_data_ratio: float,
                        max_samples: int | None, k: int, device, dtype=None, temperature: float = 0.0,
                        top_p: float = 1.0) -> dict:
    """Load `ckpt` and the verifier's lm_head, estimate, and drop both: nothing of the estimate stays
    resident for the rest of training (the lm_head alone is 2.3 GB in bf16 at Kimi-K2.5's vocab)."""
    with eager():
        lm_head = verifier_lm_head(verifier, device, dtype)
        drafter = load_checkpoint(ckpt, "cpu" if device.type == "cpu" else str(device), dtype)
        try:
            return mark_policy(estimate(drafter, lm_head, held_out_samples(data, hidden_states, train_data_ratio,
                                                                      max_samples), k, temperature, top_p),
                               rows_sampling(data))
        finally:
            del drafter, lm_head


def gpu_memory(device) -> tuple[float, float] | None:
    """(allocated, reserved) GiB on `device`, None off CUDA."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    return (round(torch.cuda.memory_allocated(device) / 2**30, 3), round(torch.cuda.memory_reserved(device) / 2**30, 3))


def release(device) -> tuple[float, float] | None:
    """Return the estimate's blocks to the driver: its block sizes differ from training's, and cached
    they kept reserved memory far above allocated for the rest of training. (allocated, reserved) after."""
    import torch

    gc.collect()
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.empty_cache()
    return gpu_memory(device) or (None, None)


# Set to an epoch number, the train stage stops itself (SIGSTOP) once that checkpoint is saved and
# estimated: fault drills and tests (tests/test_pipeline_e2e.py), never a profile.
PAUSE_ENV = "EAGLELAB_PAUSE_AFTER_CHECKPOINT"


def install_trainer_hook(*, out_dir: Path, verifier: Path, data: Path, hidden_states: Path, k: int,
                         train_data_ratio: float, max_samples: int, echo, temperature: float = 0.0,
                         top_p: float = 1.0) -> None:
    """After each checkpoint speculators' Trainer saves, estimate it (rank 0) and record the result.

    The checkpoint is read back from disk, as serving will read it. A failed estimate is reported
    and training goes on: the estimate is advice, the checkpoint is the product. speculators'
    interrupt (its TERM/INT handler raises where the code is, often inside the estimate) is passed
    on: `lab stop train` during an estimate once let training run to its end (CI of stop 36)."""
    import speculators.train.trainer as trainer
    from speculators.train.graceful_shutdown import TrainingInterruptedError

    original = trainer.Trainer.maybe_save_checkpoint
    state: dict = {"seen": {}}

    def save_then_estimate(self, epoch, local_step: int = 0):
        original(self, epoch, local_step=local_step)
        estimate_saved(self, epoch, local_step)
        if isinstance(epoch, int) and os.environ.get(PAUSE_ENV) == str(epoch):
            # A fault drill: the stage stops itself here, whole, so that a test can stop or kill it at a
            # known point (polling for the checkpoint lost the race to the next epochs under load).
            echo(f"acceptance: paused after checkpoint {epoch} ({PAUSE_ENV}); SIGCONT goes on")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGSTOP)

    def estimate_saved(self, epoch, local_step: int) -> None:
        if not isinstance(epoch, int) or int(os.environ.get("RANK", "0")) != 0:
            return
        ckpt = Path(self.checkpointer.path) / str(epoch)
        weights = ckpt / "model.safetensors"
        if not weights.is_file() or state["seen"].get(epoch) == weights.stat().st_mtime_ns:
            return  # nothing new was saved (save_best, or a freq that skips this epoch)
        state["seen"][epoch] = weights.stat().st_mtime_ns
        t0 = time.monotonic()
        device = next(self.model.parameters()).device
        # On a GPU in training's dtype (the checkpoint is saved in it): float32 copies of the drafter and
        # of the verifier's full lm_head cost ~14 GB at Kimi-K2.5's size. On CPU float32, as before.
        dtype = None if device.type == "cpu" else getattr(self.config, "hidden_states_dtype", None)
        before = gpu_memory(device)
        try:
            doc = estimate_checkpoint(ckpt, verifier, data, hidden_states, train_data_ratio, max_samples, k,
                                      device, dtype, temperature, top_p)
        except TrainingInterruptedError:
            raise  # a TERM/INT landed during the estimate: it stops training, it is no failed estimate
        except Exception as e:  # noqa: BLE001 - advice only: training goes on
            echo(f"acceptance: estimate of {ckpt} failed ({type(e).__name__}: {e}); training goes on")
            return
        finally:
            after = release(device)
        if before is not None:
            doc["gpu_memory_gib"] = {"allocated_before": before[0], "allocated_after": after[0],
                                     "reserved_before": before[1], "reserved_after": after[1]}
        doc = record(out_dir, {"checkpoint": str(ckpt), "epoch": epoch, "local_step": local_step,
                               "global_step": int(getattr(self, "global_step", 0)),
                               "seconds": round(time.monotonic() - t0, 3), **doc})
        echo(log_line(doc))
        echo(f"acceptance: checkpoint {ckpt}: offline acceptance rate {doc['acceptance_rate']:.1%}, mean "
             f"acceptance length {doc['mean_acceptance_length']:.2f} for k={k} on {doc['samples']} held-out samples; "
             + describe(doc))

    trainer.Trainer.maybe_save_checkpoint = save_then_estimate


@click.command()
@click.option("--checkpoint", required=True, type=click.Path(path_type=Path), help="an epoch directory of train's out")
@click.option("--model", required=True, type=click.Path(path_type=Path), help="the verifier")
@click.option("--data", required=True, type=click.Path(path_type=Path), help="prepare's output")
@click.option("--hidden-states", required=True, type=click.Path(path_type=Path), help="extract's output")
@click.option("--k", default=3, show_default=True, help="speculative tokens per draft (num_speculative_tokens)")
@click.option("--train-data-ratio", default=0.9, show_default=True, help="as training used it")
@click.option("--max-samples", type=int, default=None, help="at most this many held-out rows")
@click.option("--temperature", default=0.0, show_default=True, help="> 0: also the sampled forecast at this temperature")
@click.option("--top-p", default=1.0, show_default=True, help="the sampled forecast's top-p")
def main(checkpoint: Path, model: Path, data: Path, hidden_states: Path, k: int, train_data_ratio: float,
         max_samples: int | None, temperature: float, top_p: float) -> None:
    """Print the offline acceptance estimate of one checkpoint as JSON."""
    drafter = load_checkpoint(checkpoint)
    doc = estimate(drafter, verifier_lm_head(model, "cpu"), held_out_samples(data, hidden_states, train_data_ratio, max_samples), k,
                   temperature, top_p)
    click.echo(json.dumps({"checkpoint": str(checkpoint), **doc}))


if __name__ == "__main__":
    main()
