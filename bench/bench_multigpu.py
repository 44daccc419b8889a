"""Multi-GPU scaling on one host (issue #19): extraction and training on 1 -> N GPUs, through the
stage scripts as the pipeline runs them, tokens/s per GPU and the scaling efficiency against 1 GPU.

  extract  `extract --backend transformers --world-size N --rank all`: N processes, one per GPU
           (eaglelab.stages.shards; N = 1 is the plain one-process stage). Aggregate rate = sum of the shards' tokens / the slowest shard's
           loop time (each shard's own `Timing:` line; model loads excluded), and the stage's wall
           time with them.
  train    `train --gpus N --torchrun`: speculators' trainer under torchrun, DDP over NCCL (N = 1 runs
           through torchrun too, so 1 -> N compares the same code path). Per-GPU rate = rank 0's
           `profile/tokens_per_s` (its batch over its step time, the gradient all-reduce included),
           median after the first 2 steps (step 0 compiles); aggregate = N x that (every rank steps
           on a batch of the same token budget).
  efficiency(N) = per-GPU rate at N / per-GPU rate at 1.

On an 8-GPU H200 host (python3 with torch + transformers; speculators' wheels: bench/gpu_stages.sh):

    PYTHONPATH=.gpu_site:py python3 bench/bench_multigpu.py --counts 1 2 4 8 --samples 1600 \
        --train-steps 60 --out bench_out/multigpu

--allow-shared lets extraction shards share GPUs (round robin) when N exceeds the GPUs visible: the
code path on one GPU, not a scaling figure. Training never shares (NCCL refuses two ranks on one
GPU): counts beyond the GPUs are skipped for it. Writes --out/results.json and every stage's log.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_stages import make_rows, stage  # the same stage runner and data as gpu_stages.py

_TIMING = re.compile(r"^(?:\[rank(?P<r>\d+)\]: )?extract: Timing: (?P<el>[\d.]+)s elapsed, [\d.]+ samples/s, "
                     r"(?P<tps>[\d.]+) tokens/s", re.M)


def extract_figures(text: str, n: int, wall: float, tokens: int) -> dict:
    shards = {int(m.group("r") or 0): (float(m.group("el")), float(m.group("tps"))) for m in _TIMING.finditer(text)}
    if len(shards) != n:
        return {"error": f"{len(shards)} of {n} shards printed a Timing line", "stage_s": wall}
    loop_s = max(el for el, _ in shards.values())
    agg = sum(el * tps for el, tps in shards.values()) / loop_s if loop_s else float("nan")
    return {"aggregate_tokens_per_s": agg, "per_gpu_tokens_per_s": agg / n, "slowest_shard_loop_s": loop_s,
            "stage_s": wall, "stage_tokens_per_s": tokens / wall,
            "shards": {r: {"loop_s": el, "tokens_per_s": tps} for r, (el, tps) in sorted(shards.items())}}


def train_figures(text: str, n: int, wall: float) -> dict:
    rank0 = [float(x) for x in re.findall(r"^\[default0\]:.*profile/tokens_per_s=([\d.e+]+)", text, re.M)]
    steady = rank0[2:] or rank0
    per_gpu = statistics.median(steady) if steady else float("nan")
    return {"per_gpu_tokens_per_s": per_gpu, "aggregate_tokens_per_s": per_gpu * n, "steps_logged": len(rank0),
            "stage_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8], help="GPU counts to measure")
    ap.add_argument("--out", type=Path, default=Path("bench_out/multigpu"))
    ap.add_argument("--samples", type=int, default=1600)
    ap.add_argument("--seq-hi", type=int, default=1800, help="longest random sample (tokens)")
    ap.add_argument("--arch", default="llama", help="llama | deepseek_v3 (MoE + MLA, Kimi-K2.5's class)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8, help="extraction batch per shard")
    ap.add_argument("--train-steps", type=int, default=60, help="optimizer steps per training run (0: no training)")
    ap.add_argument("--attn", default="sdpa", help="sdpa | simple_flex_attention (step 0 compiles ~2 min)")
    ap.add_argument("--draft-vocab", type=int, default=1024)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script (gloo, processes share cores)")
    ap.add_argument("--allow-shared", action="store_true", help="extraction shards may share GPUs (code path only)")
    a = ap.parse_args()
    import torch

    gpus = torch.cuda.device_count() if a.device == "cuda" else 0
    if a.device == "cuda" and not gpus:
        sys.exit("bench_multigpu: no CUDA device here")
    if a.device == "cuda" and max(a.counts) > gpus and not a.allow_shared:
        sys.exit(f"bench_multigpu: --counts up to {max(a.counts)} but {gpus} GPU(s) here; "
                 "--allow-shared to run the code path anyway (no scaling figure)")
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if gpus else "cpu"
    print(f"bench_multigpu: {gpus} x {name}, torch {torch.__version__}, counts {a.counts}, out {out}")
    res: dict = {"device": name, "gpus_visible": gpus, "torch": torch.__version__, "counts": a.counts,
                 "extract": {}, "train": {}, "shared_gpus": any(n > gpus for n in a.counts) if gpus else None}

    model, prepared, vocab = out / "model", out / "prepared", out / "vocab"
    stage("tiny_model", "--out", str(model), "--arch", a.arch, "--hidden", str(a.hidden), "--layers", str(a.layers),
          "--heads", str(a.heads), "--kv-heads", "4", "--experts", str(a.experts),
          "--intermediate", str(a.hidden * 11 // 4 if a.arch == "llama" else a.hidden * 2),
          "--max-shard-size", "200MB", log=out / "model.log")
    res["parameters"] = json.loads((model / "manifest.json").read_text())["counts"]["parameters"]
    tokens = make_rows(out / "rows.jsonl", a.samples, 4096, a.seq_hi // 3, a.seq_hi, seed=0)
    stage("prepare", "--model", str(model), "--data", str(out / "rows.jsonl"), "--out", str(prepared),
          "--seq-length", "8192", log=out / "prepare.log")
    stage("vocab", "--data", str(prepared), "--model", str(model), "--draft-vocab-size", str(a.draft_vocab),
          "--out", str(vocab), log=out / "vocab.log")
    res.update(samples=a.samples, tokens=tokens)
    print(f"model: {a.arch}, {res['parameters'] / 1e6:.0f} M parameters; {a.samples} samples, {tokens} tokens")
    aux = " ".join(map(str, sorted({min(2, a.layers - 1), a.layers // 2, max(a.layers - 3, 1)})))

    hs_for_train = None
    for n in a.counts:
        hs = out / f"hs_{n}"
        shutil.rmtree(hs, ignore_errors=True)
        t0 = time.perf_counter()
        _, text = stage("extract", "--backend", "transformers", "--device", a.device, "--batch-size", str(a.batch),
                        "--model", str(model), "--data", str(prepared), "--out", str(hs), "--aux-layers", aux,
                        "--world-size", str(n), "--rank", "all", log=out / f"extract_{n}.log")
        res["extract"][n] = fig = extract_figures(text, n, time.perf_counter() - t0, tokens)
        print(f"extract on {n}: {json.dumps(fig)}")
        hs_for_train = hs_for_train or hs
    for n in a.counts if a.train_steps else []:
        if a.device == "cuda" and n > gpus:
            print(f"train on {n}: skipped ({gpus} GPU(s) here; NCCL does not put two ranks on one GPU)")
            continue
        ck = out / f"ck_{n}"
        shutil.rmtree(ck, ignore_errors=True)
        t0 = time.perf_counter()
        _, text = stage("train", "--model", str(model), "--data", str(prepared), "--hidden-states", str(hs_for_train),
                        "--vocab", str(vocab), "--out", str(ck), "--aux-layers", aux, "--draft-vocab-size",
                        str(a.draft_vocab), "--epochs", "1", "--max-steps", str(a.train_steps), "--total-seq-len",
                        "8192", "--device", a.device, "--draft-attn-impl", a.attn, "--loss-implementation", "eager",
                        "--loss-fn", "ce", "--gpus", str(n), "--torchrun", "--acceptance-k", "0",
                        log=out / f"train_{n}.log")
        res["train"][n] = fig = train_figures(text, n, time.perf_counter() - t0)
        print(f"train on {n}: {json.dumps(fig)}")

    print("\n| GPUs | extract tokens/s (all) | per GPU | efficiency | train tokens/s (all) | per GPU | efficiency |")
    print("|---|---|---|---|---|---|---|")
    e1 = (res["extract"].get(a.counts[0]) or {}).get("per_gpu_tokens_per_s")
    t1 = (res["train"].get(a.counts[0]) or {}).get("per_gpu_tokens_per_s")
    for n in a.counts:
        e, t = res["extract"].get(n, {}), res["train"].get(n, {})
        row = [str(n)]
        for fig, base in ((e, e1), (t, t1)):
            per = fig.get("per_gpu_tokens_per_s")
            row += ([f"{fig['aggregate_tokens_per_s']:.0f}", f"{per:.0f}", f"{per / base:.2f}" if base else "-"]
                    if per is not None else ["-", "-", "-"])
        print("| " + " | ".join(row) + " |")
    if res["shared_gpus"]:
        print("(shards shared GPUs: these are code-path runs, not scaling figures)")
    (out / "results.json").write_text(json.dumps(res, indent=1))
    print(f"bench_multigpu: results in {out / 'results.json'}")


if __name__ == "__main__":
    main()
