"""A tiny real training set without a vLLM server: the tiny target's own greedy continuations
(on-policy, as synth makes them) -> prepare -> extract (transformers backend) -> vocab. What
tests of the offline acceptance estimate train drafters on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AUX = "1 2 3"
DRAFT_VOCAB = "128"


def run_stage(name: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"))
    p = subprocess.run([sys.executable, "-m", f"eaglelab.stages.{name}", *args], capture_output=True, text=True,
                       env=env, timeout=600)
    if p.returncode != 0:
        raise AssertionError(f"{name} {args} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def greedy_rows(model_dir: Path, prompts: Path, max_new: int) -> list[dict]:
    """Rows with input_ids/loss_mask: the prompt's template, then the target's greedy answer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = []
    for line in prompts.read_text().splitlines():
        p = json.loads(line)
        ids = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False,
                                 pad_token_id=tok.pad_token_id or 0)
        full = out[0].tolist()
        rows.append({"id": p["id"], "input_ids": full, "loss_mask": [0] * len(ids) + [1] * (len(full) - len(ids))})
    return rows


def build(root: Path, num_prompts: int = 24, max_new: int = 96) -> dict[str, Path]:
    """model, prepared, hidden_states, vocab under root (idempotent: the stages skip what is done)."""
    paths = {k: root / k for k in ("model", "prepared", "hidden_states", "vocab")}
    run_stage("tiny_model", "--out", str(paths["model"]), "--prompts-out", str(root / "prompts.jsonl"),
              "--eval-prompts-out", str(root / "eval.jsonl"), "--num-prompts", str(num_prompts),
              "--num-eval-prompts", "2")
    synth = root / "synth.jsonl"
    if not synth.is_file():
        rows = greedy_rows(paths["model"], root / "prompts.jsonl", max_new)
        synth.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_stage("prepare", "--model", str(paths["model"]), "--data", str(synth), "--out", str(paths["prepared"]),
              "--seq-length", "1024")
    run_stage("extract", "--backend", "transformers", "--model", str(paths["model"]), "--data",
              str(paths["prepared"]), "--out", str(paths["hidden_states"]), "--aux-layers", AUX, "--device", "cpu")
    run_stage("vocab", "--data", str(paths["prepared"]), "--model", str(paths["model"]), "--draft-vocab-size",
              DRAFT_VOCAB, "--out", str(paths["vocab"]))
    return paths
