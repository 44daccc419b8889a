"""GPU benchmark of the stages that run without vLLM: hidden-state extraction with the transformers
backend and speculators training steps, on CUDA, through the stage scripts themselves.

Run by bench/gpu_stages.sh on a GPU machine (torch + transformers there, speculators from wheels).
Prints tokens/s figures, each with a baseline measured in the same run (extraction at batch 1 vs
batch 8; training steps vs the extraction forward rate), and writes them to --out/results.json.

Data: random token sequences (seeded) passed straight through `prepare` (speculators accepts rows
that already carry input_ids + loss_mask): throughput does not depend on what the tokens say, and
the GPU machine has no vLLM to generate on-policy responses with.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def stage(name: str, *args: str, log: Path) -> tuple[float, str]:
    env = dict(os.environ, COLUMNS="1000", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "py"), env.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", f"eaglelab.stages.{name}", *args], env=env, capture_output=True,
                       text=True)
    dt = time.perf_counter() - t0
    log.write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        print(f"== {name} failed (exit {p.returncode}); last lines of {log}:")
        print("\n".join((p.stdout + p.stderr).splitlines()[-30:]))
        sys.exit(p.returncode)
    return dt, p.stdout + p.stderr


def make_rows(path: Path, n: int, vocab: int, lo: int, hi: int, seed: int) -> int:
    rng = random.Random(seed)
    total = 0
    with open(path, "w") as f:
        for i in range(n):
            length = rng.randint(lo, hi)
            prompt = length // 4
            ids = [rng.randrange(8, vocab) for _ in range(length)]
            f.write(json.dumps({"id": f"r{i}", "input_ids": ids, "loss_mask": [0] * prompt + [1] * (length - prompt)}) + "\n")
            total += length
    return total


def extract_rate(out: str) -> float:
    m = re.search(r"Timing: .* ([\d.]+) tokens/s", out)
    return float(m.group(1)) if m else float("nan")


def gpu_time_breakdown(model_dir: Path, data: Path, out: Path, device: str, batch: int, threads: int,
                       aux: list[int], samples: int) -> list[str]:
    """Where the extraction's device time goes: torch.profiler over the stage's own loop (forward,
    pinned copies on the side stream, writer threads) on the first `samples` samples."""
    import torch
    from datasets import load_from_disk
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(REPO / "py"))
    from eaglelab.stages.extract import run_transformers

    ds = load_from_disk(str(data))
    out.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    run_transformers(model_dir, ds, list(range(min(samples, len(ds)))), out, aux, device, batch, threads)  # warm-up
    with profile(activities=acts) as prof:
        run_transformers(model_dir, ds, list(range(min(samples, len(ds)))), out, aux, device, batch, threads)
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=16, max_name_column_width=60).splitlines()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench_out/gpu"))
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--arch", default="llama", help="llama | deepseek_v3 (MoE + MLA, Kimi-K2.5's class)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8, help="extraction batch (batch 1 is measured too)")
    ap.add_argument("--writer-threads", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=30)
    ap.add_argument("--loss-fn", default="ce", help="ce: the target's argmax (what greedy verification accepts)")
    ap.add_argument("--seq-hi", type=int, default=1800, help="longest random sample (tokens)")
    ap.add_argument("--profile-samples", type=int, default=48)
    ap.add_argument("--draft-vocab", type=int, default=1024)
    ap.add_argument("--attn", default="sdpa", help="sdpa | simple_flex_attention (compiles ~2 min in step 0)")
    ap.add_argument("--device", default="cuda", help="cpu: a small dry run of this script itself")
    a = ap.parse_args()
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_stages: no CUDA device here")
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    print(f"gpu_stages: {name}, torch {torch.__version__}, out {out}")
    results: dict = {"device": name, "torch": torch.__version__, "arch": a.arch}

    model = out / "model"
    t0 = time.perf_counter()
    dt, _ = stage("tiny_model", "--out", str(model), "--arch", a.arch, "--hidden", str(a.hidden),
                  "--layers", str(a.layers), "--heads", str(a.heads), "--kv-heads", "4", "--experts", str(a.experts),
                  "--intermediate", str(a.hidden * 11 // 4 if a.arch == "llama" else a.hidden * 2),
                  "--max-shard-size", "200MB", log=out / "model.log")
    n_params = json.loads((model / "manifest.json").read_text())["counts"]["parameters"]
    print(f"model: {a.arch}, {n_params / 1e6:.0f} M parameters (hidden {a.hidden}, {a.layers} layers), made in {dt:.1f}s")
    results["parameters"] = n_params
    tokens = make_rows(out / "rows.jsonl", a.samples, 4096, a.seq_hi // 3, a.seq_hi, seed=0)
    dt, _ = stage("prepare", "--model", str(model), "--data", str(out / "rows.jsonl"), "--out", str(out / "prepared"),
                  "--seq-length", "8192", log=out / "prepare.log")
    print(f"prepare: {a.samples} samples, {tokens} tokens in {dt:.1f}s")
    results["tokens"] = tokens

    aux = sorted({min(2, a.layers - 1), a.layers // 2, max(a.layers - 3, 1)})
    aux_s = " ".join(map(str, aux))
    rates, timings = {}, {}
    # forward-only twice, first and last: the spread between them is the run-to-run noise (and the
    # first carries the warm-up of a fresh machine: page cache of the weights, allocator, kernels)
    runs = [(f"b{a.batch}_forward_only", a.batch, 0, True), (f"b{a.batch}_inline", a.batch, 0, False),
            (f"b{a.batch}_overlap", a.batch, a.writer_threads, False), (f"b{a.batch}_forward_only_2", a.batch, 0, True)]
    pat = (r"device time: forward ([\d.]+)s, copy ([\d.]+)s; waiting on writers ([\d.]+)s, writing ([\d.]+)s")
    for label, bs, threads, fwd_only in runs:
        hs = out / f"hidden_states_{label}"
        args = ["--backend", "transformers", "--device", a.device, "--batch-size", str(bs), "--writer-threads",
                str(threads), "--model", str(model), "--data", str(out / "prepared"), "--out", str(hs),
                "--aux-layers", aux_s] + (["--forward-only"] if fwd_only else [])
        dt, text = stage("extract", *args, log=out / f"extract_{label}.log")
        rates[label] = extract_rate(text)
        m = re.search(pat, text)
        timings[label] = dict(zip(["forward_s", "copy_s", "writer_wait_s", "writing_s"], map(float, m.groups()))) if m else {}
        size = sum(p.stat().st_size for p in hs.glob("hs_*.safetensors")) if hs.exists() else 0
        print(f"extract {label}: {rates[label]:.0f} tokens/s; stage {dt:.1f}s; {timings[label]}; "
              f"{size / 1e9:.2f} GB of hs files")
    fo = max(rates[f"b{a.batch}_forward_only"], rates[f"b{a.batch}_forward_only_2"])
    results["extract_tokens_per_s"] = rates
    results["extract_timings"] = timings
    results["overlap_vs_forward_only"] = rates[f"b{a.batch}_overlap"] / fo
    results["inline_vs_forward_only"] = rates[f"b{a.batch}_inline"] / fo
    print(f"extract: vs the faster forward-only run (batch {a.batch}, {fo:.0f} tokens/s): blocking copies + inline "
          f"writes {results['inline_vs_forward_only']:.2f}x, pinned copies + {a.writer_threads} writer threads "
          f"{results['overlap_vs_forward_only']:.2f}x")

    table = gpu_time_breakdown(model, out / "prepared", out / "hidden_states_profiled", a.device, a.batch,
                               a.writer_threads, aux, a.profile_samples)
    (out / "gpu_time.txt").write_text("\n".join(table) + "\n")
    print(f"extract (pinned copies + writers), where the device time goes (torch.profiler, batch {a.batch}, "
          f"first {a.profile_samples} samples):")
    print("\n".join(table))

    dt, _ = stage("vocab", "--data", str(out / "prepared"), "--model", str(model), "--draft-vocab-size",
                  str(a.draft_vocab), "--out", str(out / "vocab"), log=out / "vocab.log")
    dt, text = stage("train", "--model", str(model), "--data", str(out / "prepared"),
                     "--hidden-states", str(out / f"hidden_states_b{a.batch}_overlap"), "--vocab", str(out / "vocab"),
                     "--out", str(out / "checkpoints"), "--aux-layers", aux_s, "--draft-vocab-size",
                     str(a.draft_vocab), "--epochs", "1", "--max-steps", str(a.train_steps), "--total-seq-len", "8192",
                     "--device", a.device, "--draft-attn-impl", a.attn, "--loss-implementation", "eager",
                     "--loss-fn", a.loss_fn,
                     log=out / "train.log")
    tps = [float(x) for x in re.findall(r"profile/tokens_per_s=([\d.e+]+)", text)]
    steady = tps[1:] or tps
    med = statistics.median(steady) if steady else float("nan")
    # Offline acceptance: speculators' validation pass, per draft position (full_acc_k: all k+1 first
    # drafted tokens right = the chance a k+1-token draft is accepted whole under greedy verification).
    val = {k: float(v) for k, v in re.findall(r"val/(full_acc_\d+)_epoch=([\d.e+-]+)", text)}
    results.update(train_tokens_per_s_median=med, train_steps_logged=len(tps), train_stage_s=dt, attn=a.attn,
                   offline_acceptance=val)
    print(f"train ({a.attn}, eager loss, {a.train_steps} steps): median {med:.0f} tokens/s after step 0 "
          f"({len(tps)} steps logged); stage {dt:.1f}s incl. step-0 compile")
    print(f"offline acceptance (validation, per position): {val or 'no val/ lines logged'}")
    results["wall_s"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"gpu_stages: results in {out / 'results.json'}")


if __name__ == "__main__":
    main()
