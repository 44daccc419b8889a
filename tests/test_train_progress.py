"""Training has an ETA: the real train stage (speculators' trainer on CPU, a tiny model made here)
run through `lab run train --detach`, and `lab status --json` read while it runs shows where
training is in optimizer steps, with an ETA and a range, not the last bar the log printed.

The inputs are made by the real stages (tiny_model, prepare, extract with the transformers backend,
vocab) from token rows written here (no vLLM server needed: prepare passes rows that carry
input_ids/loss_mask straight through). Slow-ish (~2-4 min on 2 shared cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 4


def stage(name: str, *args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"))
    p = subprocess.run([sys.executable, "-m", f"eaglelab.stages.{name}", *args], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0, f"{name} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("train_inputs")
    stage("tiny_model", "--out", str(d / "model"), "--prompts-out", str(d / "prompts.jsonl"),
          "--eval-prompts-out", str(d / "eval.jsonl"), "--num-prompts", "24", "--num-eval-prompts", "2")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d / "model"))
    with open(d / "rows.jsonl", "w") as f:
        for line in (d / "prompts.jsonl").read_text().splitlines():
            row = json.loads(line)
            prompt = tok(row["messages"][0]["content"])["input_ids"]
            answer = tok((row["messages"][0]["content"] + " ") * 3)["input_ids"]
            f.write(json.dumps({"id": row["id"], "input_ids": prompt + answer,
                                "loss_mask": [0] * len(prompt) + [1] * len(answer)}) + "\n")
    stage("prepare", "--model", str(d / "model"), "--data", str(d / "rows.jsonl"), "--out", str(d / "prepared"),
          "--seq-length", "1024")
    stage("extract", "--backend", "transformers", "--device", "cpu", "--model", str(d / "model"),
          "--data", str(d / "prepared"), "--out", str(d / "hs"), "--aux-layers", "1 2 3")
    stage("vocab", "--data", str(d / "prepared"), "--model", str(d / "model"), "--draft-vocab-size", "128",
          "--out", str(d / "vocab"))
    return d


def test_train_stage_shows_a_step_eta_while_it_runs(tmplab, inputs):
    d = inputs
    tmplab.write_pipeline(f"""\
        stages:
          train:
            host: local
            command: ["${{python}}", "-m", "eaglelab.stages.train", "--model", "{d / 'model'}",
                      "--data", "{d / 'prepared'}", "--hidden-states", "{d / 'hs'}", "--vocab", "{d / 'vocab'}",
                      "--out", "{tmplab.work / 'ck'}", "--aux-layers", "1 2 3", "--draft-vocab-size", "128",
                      "--epochs", "{EPOCHS}", "--lr", "3e-3", "--loss-fn", "ce", "--total-seq-len", "1024",
                      "--device", "cpu"]
            stop_grace_s: 5
        """)
    tmplab.lab("run", "train", "--detach")

    def step_eta():
        run = next((r for r in tmplab.runs("train")), None)
        prog = ((run or {}).get("log_state") or {}).get("progress") or {}
        if run and run["state"] != "running":
            raise AssertionError(f"train ended before a step ETA was seen: {json.dumps(run)[-3000:]}")
        return (run, prog) if prog.get("label") == "training steps" and prog.get("eta_s") is not None else None

    try:
        run, prog = tmplab.wait_for(step_eta, timeout=900, interval=2.0)
    finally:
        tmplab.lab("stop", "train", check=False, timeout=120)
    training = run["log_state"]["training"]
    # Where training is: steps of the whole run (the stage announced epochs x steps per epoch).
    assert training["epochs"] == EPOCHS and training["steps_per_epoch"] >= 1
    assert prog["total"] == training["total_steps"] == EPOCHS * training["steps_per_epoch"]
    assert 1 <= prog["n"] < prog["total"] and prog["unit"] == "step"
    assert 0 <= prog["eta_low_s"] <= prog["eta_s"] <= prog["eta_high_s"]
    # ... and the run's ETA (lab status's) is built from it.
    assert run["eta"]["source"] == "progress" and run["eta"]["eta_s"] is not None
