"""`lab parse` on logs recorded from our own stages on an H200 GPU (bench/gpu_stages.sh)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import LAB

H200 = Path(__file__).parent / "fixtures" / "logs" / "recorded" / "h200"


def parse(name: str) -> dict:
    return json.loads(subprocess.run([str(LAB), "parse", str(H200 / name), "--json"], capture_output=True,
                                     text=True, check=True).stdout)


def test_training_on_cuda_gives_loss_curve_and_throughput():
    st = parse("train.log")
    assert st["state"] == "completed" and st["failure"] is None and st["bad_lines"] == 0
    loss = st["metrics"]["train/loss"]
    assert len(loss) == 28 and loss[0] == [0, 1.228]
    assert loss[-1][1] < loss[0][1]  # it learned something in 30 steps
    rates = [v for _, v in st["metrics"]["profile/tokens_per_s"][2:]]
    assert 100_000 < sorted(rates)[len(rates) // 2] < 200_000  # the median the RESULTS.md reports
    assert [p["name"] for p in st["phases"]][:1] == ["training"]


def test_extraction_on_cuda_reaches_every_sample():
    for name in ("extract_b1.log", "extract_b8.log"):
        st = parse(name)
        assert st["state"] == "completed" and st["failure"] is None
        assert (st["progress"]["n"], st["progress"]["total"]) == (200, 200)


def test_torchrun_training_on_cuda_is_read_through_its_rank_prefixes():
    """`train --gpus 1 --torchrun` on an H200 (bench/bench_multigpu.py): every line `[default0]:`
    (torchrun --tee 3, NCCL), Rich's continuation lines keep their 11-space time column."""
    st = parse("train_torchrun1.log")
    assert st["state"] == "completed" and st["failure"] is None and st["bad_lines"] == 0
    assert st["training"]["step"] == st["training"]["total_steps"] == 12  # max_steps, every step read
    assert len(st["metrics"]["train/loss"]) == 12
    assert st["end_marker"] == "Training epoch 1/1 completed"


def test_two_extraction_shards_on_one_gpu_give_one_bar():
    """`extract --world-size 2 --rank all` with both shards on one H200: the parent's combined bar is
    the progress; the shards' lines are prefixed, their own bars not copied."""
    st = parse("extract_2shards.log")
    assert st["state"] == "completed" and st["failure"] is None
    p = st["progress"]
    assert (p["label"], p["prefix"], p["n"], p["total"]) == ("Extracting hidden states", None, 240, 240)
    assert p["postfix"] == {"r0": "120/120", "r1": "120/120"}
    assert [b["prefix"] for b in st["progress_bars"] if b["label"] == "Extracting hidden states"] == [None]
