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
import shutil
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


def compare_in_process(model_dir: Path, data: Path, out: Path, device: str, batch: int, threads: int,
                       aux: list[int], rounds: int) -> tuple[dict, list[str]]:
    """The write modes on the same batches in ONE process with the model loaded once and warmed up, in
    alternating rounds (forward-only, pinned + writers, blocking + inline): separate stage processes
    measure process warm-up and GPU clock ramps too (the first of them ran at half the speed of a later
    identical one). Returns tokens/s per mode and round, and torch.profiler's table of one overlapped
    pass (the loop only, not the model load)."""
    import torch
    from datasets import load_from_disk
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(REPO / "py"))
    from eaglelab.stages.extract import load_hf_model, run_transformers

    ds = load_from_disk(str(data))
    model = load_hf_model(model_dir, device)
    todo = list(range(len(ds)))
    modes = {"forward_only": dict(writer_threads=0, forward_only=True),
             "overlap": dict(writer_threads=threads), "inline": dict(writer_threads=0)}

    def one(mode: str, samples: list[int]) -> dict:
        dest = out / f"hs_{mode}"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        t = run_transformers(model_dir, ds, samples, dest, aux, device, batch, model=model, **modes[mode])
        return t

    one("overlap", todo[: batch * 4])  # warm-up: kernels, cuDNN plans, allocator, pinned buffers
    rates: dict[str, list[float]] = {m: [] for m in modes}
    detail: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode in modes:
            t = one(mode, todo)
            rates[mode].append(t["tokens"] / t["seconds"])
            detail[mode].append(t)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        one("overlap", todo[: batch * 8])
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=16, max_name_column_width=60).splitlines()
    model = None  # frees its memory before empty_cache (`one` holds it too)
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"rates": rates, "timings": detail}, table


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
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of the in-process comparison")
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
    # The stage itself, as the pipeline runs it (a fresh process): its files train the drafter below.
    # First without padding the batches (--pad-multiple 1: every batch a new shape), as a baseline.
    results["extract_stage"] = {}
    for pad in (1, 64):
        hs = out / ("hidden_states" if pad > 1 else "hidden_states_unpadded")
        dt, text = stage("extract", "--backend", "transformers", "--device", a.device, "--batch-size", str(a.batch),
                         "--writer-threads", str(a.writer_threads), "--model", str(model), "--data",
                         str(out / "prepared"), "--out", str(hs), "--aux-layers", aux_s, "--pad-multiple", str(pad),
                         log=out / f"extract_pad{pad}.log")
        size = sum(p.stat().st_size for p in hs.glob("hs_*.safetensors"))
        results["extract_stage"][f"pad{pad}"] = {"tokens_per_s": extract_rate(text), "stage_s": dt, "bytes": size}
        print(f"extract stage, --pad-multiple {pad} (pinned copies + {a.writer_threads} writers, a fresh process): "
              f"{extract_rate(text):.0f} tokens/s; stage {dt:.1f}s incl. model load; {size / 1e9:.2f} GB of hs files")
        if pad == 1:
            shutil.rmtree(hs)

    cmp, table = compare_in_process(model, out / "prepared", out / "cmp", a.device, a.batch, a.writer_threads,
                                    aux, a.rounds)
    results["extract_in_process"] = cmp
    med = {m: statistics.median(v) for m, v in cmp["rates"].items()}
    fo = med["forward_only"]
    results["overlap_vs_forward_only"] = med["overlap"] / fo
    results["inline_vs_forward_only"] = med["inline"] / fo
    print(f"extract, one process, {a.rounds} alternating rounds, batch {a.batch} (tokens/s per round):")
    for m, v in cmp["rates"].items():
        t = cmp["timings"][m][-1]
        print(f"  {m:13s} {' '.join(f'{x:8.0f}' for x in v)}   median {med[m]:8.0f} = {med[m] / fo:.2f}x forward-only;"
              f" last round: forward {t['forward_s']:.2f}s, copy {t['copy_s']:.2f}s (device), writer wait "
              f"{t['write_wait_s']:.2f}s, writing {t['write_busy_s']:.2f}s, elapsed {t['seconds']:.2f}s")
    (out / "gpu_time.txt").write_text("\n".join(table) + "\n")
    print(f"one overlapped pass (first {a.batch * 8} samples), where the device time goes (torch.profiler):")
    print("\n".join(table))

    if a.train_steps == 0:
        results["wall_s"] = time.perf_counter() - t0
        (out / "results.json").write_text(json.dumps(results, indent=1))
        print(f"gpu_stages: no training asked (--train-steps 0); results in {out / 'results.json'}")
        return
    dt, _ = stage("vocab", "--data", str(out / "prepared"), "--model", str(model), "--draft-vocab-size",
                  str(a.draft_vocab), "--out", str(out / "vocab"), log=out / "vocab.log")
    dt, text = stage("train", "--model", str(model), "--data", str(out / "prepared"),
                     "--hidden-states", str(out / "hidden_states"), "--vocab", str(out / "vocab"),
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
