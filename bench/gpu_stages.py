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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("bench_out/gpu"))
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--train-steps", type=int, default=30)
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
    results: dict = {"device": name, "torch": torch.__version__}

    model = out / "model"
    dt, _ = stage("tiny_model", "--out", str(model), "--hidden", str(a.hidden), "--layers", str(a.layers),
                  "--heads", "16", "--kv-heads", "4", "--intermediate", str(a.hidden * 11 // 4), "--max-shard-size",
                  "200MB", log=out / "model.log")
    n_params = json.loads((model / "manifest.json").read_text())["counts"]["parameters"]
    print(f"model: {n_params / 1e6:.0f} M parameters (hidden {a.hidden}, {a.layers} layers), made in {dt:.1f}s")
    tokens = make_rows(out / "rows.jsonl", a.samples, 4096, 600, 1800, seed=0)
    dt, _ = stage("prepare", "--model", str(model), "--data", str(out / "rows.jsonl"), "--out", str(out / "prepared"),
                  "--seq-length", "8192", log=out / "prepare.log")
    print(f"prepare: {a.samples} samples, {tokens} tokens in {dt:.1f}s")

    aux = " ".join(str(i) for i in (2, a.layers // 2, a.layers - 3))
    rates = {}
    for bs in (1, 8):
        hs = out / f"hidden_states_b{bs}"
        dt, text = stage("extract", "--backend", "transformers", "--device", a.device, "--batch-size", str(bs),
                         "--model", str(model), "--data", str(out / "prepared"), "--out", str(hs), "--aux-layers", aux,
                         log=out / f"extract_b{bs}.log")
        rates[bs] = extract_rate(text)
        size = sum(p.stat().st_size for p in hs.glob("hs_*.safetensors"))
        print(f"extract (transformers, batch {bs}): {rates[bs]:.0f} tokens/s incl. writes; stage {dt:.1f}s; "
              f"{size / 1e9:.2f} GB of hs files")
    results["extract_tokens_per_s"] = rates
    print(f"extract: batch 8 / batch 1 = {rates[8] / rates[1]:.2f}x")

    dt, _ = stage("vocab", "--data", str(out / "prepared"), "--model", str(model), "--draft-vocab-size", "1024",
                  "--out", str(out / "vocab"), log=out / "vocab.log")
    dt, text = stage("train", "--model", str(model), "--data", str(out / "prepared"),
                     "--hidden-states", str(out / "hidden_states_b8"), "--vocab", str(out / "vocab"),
                     "--out", str(out / "checkpoints"), "--aux-layers", aux, "--draft-vocab-size", "1024",
                     "--epochs", "1", "--max-steps", str(a.train_steps), "--total-seq-len", "8192",
                     "--device", a.device, "--draft-attn-impl", a.attn, "--loss-implementation", "eager",
                     log=out / "train.log")
    tps = [float(x) for x in re.findall(r"profile/tokens_per_s=([\d.e+]+)", text)]
    steady = tps[1:] or tps
    med = statistics.median(steady) if steady else float("nan")
    results.update(train_tokens_per_s_median=med, train_steps_logged=len(tps), train_stage_s=dt, attn=a.attn)
    print(f"train ({a.attn}, eager loss, {a.train_steps} steps): median {med:.0f} tokens/s after step 0 "
          f"({len(tps)} steps logged); stage {dt:.1f}s incl. step-0 compile")
    print(f"train / extract(batch 8) token rate: {med / rates[8]:.2f}x")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"gpu_stages: results in {out / 'results.json'}")


if __name__ == "__main__":
    main()
