"""The drafter at its real size (issue 29): the train stage, as the pilot and the full train run it, at
Kimi-K2.5's dimensions on one GPU, with its memory measured per phase.

    bash bench/gpu_train_real.sh --lengths 4096 8192 18432 --runs pilot full      # on the GPU machine

What it builds (in --work, big files; nothing of it comes back):
- a verifier directory with Kimi-K2.5's text config (DeepSeek-V3 shape: vocab 163,840, hidden 7168,
  61 layers, 64 heads, MLA, intermediate 18,432; `--shape llama8b`: a dense Llama-3-8B-like one), a
  small tokenizer (speculators asks one for its mask token), and random bf16 embeddings, lm_head and
  final norm: the only weights the drafter's training reads;
- per length L: --rows random-token rows of 0.55-0.95 L tokens (one row per packed batch), saved as
  prepare saves them (input_ids, loss_mask, seq_len, token_freq.pt, its manifest through prepare's own
  describe_dataset); random hidden states [S, 4, hidden] written by extract's own writer
  (write_hs_file) with extract's manifest; the vocab stage run for real (163,840 -> 32,000).
Then per run kind, the train stage in a process of its own under bench/train_probe.py:
- pilot: the argv pilot.py gives its train step (2 epochs, --acceptance-k 3);
- full: the pipeline's train command (conf/pipeline.yaml, the kimi-k2.5 profile's vars: --gpus 1,
  --trust-remote-code, ...) with --epochs 2 instead of 10 (the device time of a session).
Writes --out/results.json (every phase of every run) and --out/results.md (the table for RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("REHEARSAL_DEVICE", "cuda")  # cpu: to check the inputs it builds, on a machine without one
sys.path.insert(0, str(REPO / "py"))

SHAPES = {
    # Kimi-K2.5's text model (DeepSeek-V3 architecture); aux layers as the kimi-k2.5 profile's
    "kimi": {"arch": "deepseek_v3", "vocab": 163840, "hidden": 7168, "layers": 61, "heads": 64, "kv_heads": 64,
             "intermediate": 18432, "aux": "2 30 58", "draft_vocab": 32000},
    # Kimi-K2.5 as its own checkpoint declares it: config.json's auto_map names DeepSeek's remote config class
    # (configuration_deepseek.py, read with --trust-remote-code), which sets no head_dim: speculators then
    # derives hidden / heads = 112, not transformers' built-in 64 (issue 29, item 5)
    "kimi_remote": {"arch": "deepseek_v3", "vocab": 163840, "hidden": 7168, "layers": 61, "heads": 64,
                    "kv_heads": 64, "intermediate": 18432, "aux": "2 30 58", "draft_vocab": 32000,
                    "remote_config": True},
    # a dense verifier, Llama-3-8B-like, so the planner is calibrated on two shapes
    "llama8b": {"arch": "llama", "vocab": 128256, "hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8,
                "intermediate": 14336, "aux": "2 16 29", "draft_vocab": 32000},
}


def verifier_config(s: dict):
    if s["arch"] == "deepseek_v3":
        from transformers import DeepseekV3Config

        return DeepseekV3Config(
            vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
            moe_intermediate_size=2048, num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
            num_key_value_heads=s["kv_heads"], n_routed_experts=384, n_shared_experts=1, num_experts_per_tok=8,
            n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=1536, kv_lora_rank=512,
            qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, max_position_embeddings=262144,
            rope_theta=50000.0, tie_word_embeddings=False, torch_dtype="bfloat16")
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                       num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                       num_key_value_heads=s["kv_heads"], max_position_embeddings=131072, rope_theta=500000.0,
                       tie_word_embeddings=False, torch_dtype="bfloat16")


def make_verifier(d: Path, s: dict) -> None:
    """config.json + a small tokenizer + model.safetensors with the three tensors training reads."""
    if (d / "model.safetensors").is_file():
        return
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    d.mkdir(parents=True, exist_ok=True)
    verifier_config(s).save_pretrained(d)
    if s.get("remote_config"):
        write_remote_config(d)
    vocab = {f"t{i}": i for i in range(256)} | {"<unk>": 256, "<s>": 257, "</s>": 258}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            pad_token="</s>").save_pretrained(d)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    v, h = s["vocab"], s["hidden"]
    weights = {"model.embed_tokens.weight": (torch.randn(v, h, generator=g, device=DEVICE) * 0.02).bfloat16().cpu(),
               "lm_head.weight": (torch.randn(v, h, generator=g, device=DEVICE) * 0.02).bfloat16().cpu(),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    save_file(weights, str(d / "model.safetensors"), metadata={"format": "pt"})
    del weights
    free_gpu()


REMOTE_CONFIG = '''"""DeepSeek-V3's config class as a checkpoint ships it for --trust-remote-code (the fields it is given,
and no head_dim: Kimi-K2.5's configuration_deepseek.py declares none)."""
from transformers import PretrainedConfig


class DeepseekV3Config(PretrainedConfig):
    model_type = "deepseek_v3"

    def __init__(self, **kwargs):
        kwargs.pop("head_dim", None)
        super().__init__(**kwargs)
'''


def write_remote_config(d: Path) -> None:
    """config.json as the real checkpoint's: no head_dim, auto_map to its own config class beside it."""
    (d / "configuration_deepseek.py").write_text(REMOTE_CONFIG)
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("head_dim", None)
    cfg["auto_map"] = {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))


def free_gpu() -> None:
    """This process's cached blocks back to the driver: the train process's device memory is read from
    cudaMemGetInfo, which counts every process on the GPU."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_inputs(root: Path, verifier: Path, s: dict, length: int, rows: int, seed: int) -> dict[str, Path]:
    """prepared/, hidden_states/, vocab/ for `rows` rows near `length` tokens, with the stages' manifests."""
    import torch
    from datasets import Dataset

    from eaglelab import manifest
    from eaglelab.stages.extract import hs_path, write_hs_file
    from eaglelab.stages.prepare import describe_dataset

    d = {k: root / k for k in ("prepared", "hidden_states", "vocab")}
    if all(manifest.read(p) for p in d.values()):
        return d
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(seed)
    lens = [rng.randint(int(0.55 * length), int(0.95 * length)) for _ in range(rows)]
    ids = [[rng.randrange(s["vocab"]) for _ in range(n)] for n in lens]
    masks = [[0] * (n // 10) + [1] * (n - n // 10) for n in lens]  # a prompt, then the supervised response
    ds = Dataset.from_dict({"input_ids": ids, "loss_mask": masks, "seq_len": lens})
    ds.set_format(type="torch")  # as speculators' preprocessing saves it (its loader reads tensors)
    ds.save_to_disk(str(d["prepared"]))
    freq: dict[int, int] = {}
    for row, m in zip(ids, masks):
        for t, keep in zip(row, m):
            if keep:
                freq[t] = freq.get(t, 0) + 1
    torch.save(freq, d["prepared"] / "token_freq.pt")
    counts = describe_dataset(d["prepared"], s["vocab"])
    files = [p for p in d["prepared"].iterdir() if p.is_file() and p.name != manifest.NAME]
    prep = manifest.write(d["prepared"], "prepare", files, params={"rehearsal": {"length": length, "rows": rows,
                                                                                 "seed": seed}}, counts=counts)
    # hidden states: [S, 3 aux + last, hidden] bf16, in extract's own file format and manifest
    aux = [int(x) for x in s["aux"].split()]
    d["hidden_states"].mkdir(parents=True)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    pool = torch.randn(max(lens) + rows, len(aux) + 1, s["hidden"], generator=g, device=DEVICE,
                       dtype=torch.bfloat16).cpu()  # one random block, each row a window of it: writes, not randn
    free_gpu()
    for i, (n, row) in enumerate(zip(lens, ids)):
        write_hs_file(hs_path(d["hidden_states"], i), pool[i:i + n], row)
    del pool
    params = {"data": prep["fingerprint"], "aux_layers": aux, "layer_ids": aux + [s["layers"]], "max_samples": None,
              "world_size": 1}
    manifest.write(d["hidden_states"], "extract", [hs_path(d["hidden_states"], i) for i in range(rows)],
                   params=params, hash_limit=0,
                   counts={"samples": rows, "tokens": sum(lens), "layers": len(aux) + 1, "hidden_size": s["hidden"],
                           "trimmed": 0}, extra={"backend": "rehearsal (random states)"})
    run([sys.executable, "-m", "eaglelab.stages.vocab", "--data", str(d["prepared"]), "--model", str(verifier),
         "--draft-vocab-size", str(s["draft_vocab"]), "--out", str(d["vocab"])], root / "vocab.log")
    return d


def run(cmd: list[str], log: Path, timeout: float | None = None) -> int:
    env = dict(os.environ, COLUMNS="1000", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "py"), env.get("PYTHONPATH")]))
    with open(log, "w") as f:
        try:
            p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            f.write(f"\nrehearsal: stopped after {timeout} s\n")
            return 124
    if p.returncode and "vocab" in log.name:
        print(log.read_text()[-3000:])
        raise SystemExit(f"{cmd[2]} failed")
    return p.returncode


def train_argv(kind: str, s: dict, verifier: Path, d: dict[str, Path], out: Path, length: int, epochs: int) -> list[str]:
    common = ["--model", str(verifier), "--data", str(d["prepared"]), "--hidden-states", str(d["hidden_states"]),
              "--vocab", str(d["vocab"]), "--out", str(out), "--aux-layers", s["aux"],
              "--draft-vocab-size", str(s["draft_vocab"]), "--epochs", str(epochs), "--lr", "1e-3",
              "--loss-fn", "kl_div"]
    if kind == "pilot":  # stages/pilot.py's train step
        return [*common, "--total-seq-len", str(length), "--device", "cuda", "--acceptance-k", "3", "--seed", "42",
                "--no-trust-remote-code"]
    # conf/pipeline.yaml's train command with the kimi-k2.5 profile's vars
    return [*common, "--total-seq-len", str(length), "--device", "cuda", "--gpus", "1", "--acceptance-k", "3",
            "--seed", "42", "--warm-start", "", "--warm-start-vocab", "check", "--trust-remote-code"]


def summarize(rec: dict) -> dict:
    """One row: per phase kind the worst peak; steady steps (epoch >= 1) median ms and tokens/s."""
    import statistics

    by: dict[str, dict] = {}
    for p in rec["phases"]:
        if "peak_allocated" not in p:
            continue
        key = p["phase"] if p["phase"] != "steps" else ("steps_first_epoch" if p["epoch"] in (0, None) else "steps")
        b = by.setdefault(key, {"peak_allocated": 0.0, "peak_reserved": 0.0, "device_used": 0.0, "seconds": []})
        b["peak_allocated"] = max(b["peak_allocated"], p["peak_allocated"])
        b["peak_reserved"] = max(b["peak_reserved"], p["peak_reserved"])
        b["device_used"] = max(b["device_used"], p["after"]["device_used"])
        b["seconds"].append(p["seconds"])
    steady = [x for x in rec["steps"] if (x["epoch"] or 0) >= 1] or rec["steps"][1:]
    est = [p for p in rec["phases"] if p["phase"] == "estimate" and "after" in p]
    return {"phases": by, "steps_logged": len(rec["steps"]),
            "step_ms_median": statistics.median(x["step_ms"] for x in steady) if steady else None,
            "tokens_per_s_median": statistics.median(x["tokens_per_s"] for x in steady) if steady else None,
            "estimate_allocated_before_after": [(p["before"]["allocated"], p["after"]["allocated"]) for p in est],
            "estimate_reserved_before_after": [(p["before"]["reserved"], p["after"]["reserved"]) for p in est],
            "epochs_done": len([p for p in rec["phases"] if p["phase"] == "validation" and "error" not in p]),
            "error": rec.get("error")}


def markdown(results: list[dict]) -> str:
    lines = ["| shape | run | seq len | phase | peak allocated GiB | peak reserved GiB | device used GiB | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        sm = r["summary"]
        for name, b in sm["phases"].items():
            lines.append(f"| {r['shape']} | {r['run']} | {r['length']} | {name} | {b['peak_allocated']:.1f} | "
                         f"{b['peak_reserved']:.1f} | {b['device_used']:.1f} | "
                         f"{'/'.join(f'{x:.0f}' for x in b['seconds'])} |")
    lines += ["", "| shape | run | seq len | rc | epochs done | step ms (median, epoch 2) | tokens/s | estimate: allocated before -> after GiB | wall s |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        sm = r["summary"]
        est = ", ".join(f"{a:.1f} -> {b:.1f}" for a, b in sm["estimate_allocated_before_after"])
        lines.append(f"| {r['shape']} | {r['run']} | {r['length']} | {r['rc']} | {sm['epochs_done']} | "
                     f"{sm['step_ms_median'] or float('nan'):.0f} | {sm['tokens_per_s_median'] or float('nan'):,.0f} | "
                     f"{est} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/real_train"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/real_train_out")))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="kimi")
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 18432])
    ap.add_argument("--runs", nargs="+", choices=["pilot", "full"], default=["pilot", "full"])
    ap.add_argument("--rows", type=int, default=14, help="rows per length: 90%% train, 10%% held out")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=540, help="seconds per train run")
    a = ap.parse_args()
    import torch

    s = SHAPES[a.shape]
    a.out.mkdir(parents=True, exist_ok=True)
    verifier = a.work / f"verifier_{a.shape}"
    t0 = time.perf_counter()
    make_verifier(verifier, s)
    print(f"rehearsal: verifier {verifier} ({time.perf_counter() - t0:.0f} s)", flush=True)
    results_path = a.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else []
    for length in a.lengths:
        t1 = time.perf_counter()
        d = make_inputs(a.work / f"{a.shape}_{length}", verifier, s, length, a.rows, seed=length)
        print(f"rehearsal: inputs for {length} tokens ({time.perf_counter() - t1:.0f} s)", flush=True)
        for kind in a.runs:
            out = a.work / f"{a.shape}_{length}" / f"checkpoints_{kind}"
            shutil.rmtree(out, ignore_errors=True)
            rec_path = a.out / f"probe_{a.shape}_{kind}_{length}.json"  # kept if the call is cut short
            log = a.out / f"train_{a.shape}_{kind}_{length}.log"
            t2 = time.perf_counter()
            rc = run([sys.executable, str(REPO / "bench" / "train_probe.py"), str(rec_path), "--",
                      *train_argv(kind, s, verifier, d, out, length, a.epochs)], log, a.timeout)
            rec = json.loads(rec_path.read_text()) if rec_path.is_file() else {"phases": [], "steps": []}
            est_docs = [json.loads(x) for x in (out / "acceptance.jsonl").read_text().splitlines()] \
                if (out / "acceptance.jsonl").is_file() else []
            r = {"shape": a.shape, "run": kind, "length": length, "rc": rc, "wall_s": time.perf_counter() - t2,
                 "torch": torch.__version__, "summary": summarize(rec), "record": rec,
                 "estimates": [{k: e.get(k) for k in ("epoch", "seconds", "samples", "gpu_memory_gib")}
                               for e in est_docs]}
            results.append(r)
            results_path.write_text(json.dumps(results, indent=1))
            (a.out / "results.md").write_text(markdown(results))
            sm = r["summary"]
            print(f"rehearsal: {a.shape} {kind} {length}: rc={rc} epochs={sm['epochs_done']} "
                  f"step_ms={sm['step_ms_median']} tok/s={sm['tokens_per_s_median']} error={sm['error']} "
                  f"wall={r['wall_s']:.0f}s", flush=True)
            if rc != 0:
                print(log.read_text()[-4000:], flush=True)
            shutil.rmtree(out, ignore_errors=True)  # checkpoints: GBs each
        shutil.rmtree(a.work / f"{a.shape}_{length}" / "hidden_states", ignore_errors=True)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
