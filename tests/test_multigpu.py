"""Several processes on one host, as an 8-GPU machine runs them, checked on CPU (issue #19):

- the train stage with --gpus 2 relaunches itself under torchrun: speculators' trainer with DDP over
  gloo, two ranks; rank 0 alone says the plan and the acceptance, and writes the checkpoints, the
  manifest and the drafter link; torchrun's `--tee 3` prefixes every line `[default<rank>]:`; the
  progress the parser reads from that log, fed as a live tail reads it, only moves forward and is
  rank 0's steps;
- the extract stage with --world-size 2 --rank all runs one process per shard: the merged manifest
  is whole, the stage's one bar (sum of the shards') only moves forward and reaches the total, a
  shard that fails midway is named with its last lines, and after a SIGKILL midway (a shard blocked
  on a fifo in place of its next file) the rerun redoes only the samples each shard lacks.

Real parts throughout: the tiny model, prepare, extraction, speculators 0.9.0, torch.distributed.
~4-5 min on 2 shared cores (the inputs ~50 s, training ~25 s, each of 4 extraction runs ~30 s)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import foresight_data
from eaglelab import manifest
from eaglelab.host.parse.state import LogState
from eaglelab.host.tail.frames import FrameSplitter
from eaglelab.host.tail.whole import bar_eta

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 3


@pytest.fixture
def data(tiny_data) -> dict[str, Path]:
    return tiny_data  # the session's (tests/conftest.py); the tests write only under their tmp_path


def stage(name: str, *args: str, log: Path) -> subprocess.CompletedProcess:
    """The stage as jobwrap runs it: stdout and stderr into one log file."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"), COLUMNS="1000", PYTHONUNBUFFERED="1")
    with open(log, "wb") as f:
        return subprocess.run([sys.executable, "-m", f"eaglelab.stages.{name}", *args], stdout=f,
                              stderr=subprocess.STDOUT, env=env, timeout=600)


def live_progress(log: bytes, chunk: int = 300) -> list[dict]:
    """The state's progress after each chunk, fed as the tailer feeds a growing file."""
    st = LogState(bar_eta=bar_eta)
    sp = FrameSplitter(st.feed_line, st.feed_frame, on_block=st.feed_block)
    seen = []
    for i in range(0, len(log), chunk):
        sp.feed(log[i:i + chunk])
        snap = st.snapshot(now=1e9 + i, alive=True)
        if snap["progress"]:
            seen.append({**snap["progress"], "training": snap.get("training")})
    sp.flush()
    return seen


def test_train_on_two_ranks_with_gloo(data, tmp_path):
    out, log = tmp_path / "ck", tmp_path / "train.log"
    p = stage("train", "--model", str(data["model"]), "--data", str(data["prepared"]),
              "--hidden-states", str(data["hidden_states"]), "--vocab", str(data["vocab"]), "--out", str(out),
              "--aux-layers", foresight_data.AUX, "--draft-vocab-size", foresight_data.DRAFT_VOCAB,
              "--epochs", str(EPOCHS), "--total-seq-len", "256", "--device", "cpu", "--gpus", "2",
              "--acceptance-k", "2", "--acceptance-samples", "4", log=log)
    text = log.read_text(errors="replace")
    assert p.returncode == 0, text[-4000:]
    lines = text.splitlines()
    # Both ranks ran, and said so through torchrun's prefixes.
    assert any(line.startswith("[default0]:") for line in lines)
    assert any(line.startswith("[default1]:") for line in lines)
    assert any(line.startswith("[default1]:") and "Destroyed distributed process group" in line for line in lines)
    # Rank 0 alone speaks for the stage and writes its outputs, once.
    for what in ("train: plan: ", "train: done, drafter checkpoint", "train: speculators train "):
        said = [line for line in lines if what in line]
        assert len(said) == 1 and said[0].startswith("[default0]:"), (what, said)
    acc = [line for line in lines if "acceptance: checkpoint" in line]
    assert len(acc) == EPOCHS and all(line.startswith("[default0]:") for line in acc)
    assert sorted(d.name for d in out.iterdir() if d.name.isdigit()) == [str(e) for e in range(EPOCHS)]
    assert os.readlink(out / "drafter") == str(EPOCHS - 1)
    doc = manifest.read(out)
    assert doc["counts"]["epochs_done"] == EPOCHS and doc["extra"]["drafter"] == str(EPOCHS - 1)
    assert len((out / "acceptance.jsonl").read_text().splitlines()) == EPOCHS
    assert list((out / "logs" / "torchrun").rglob("stdout.log"))  # each rank's own copy

    # The progress a live tail shows: training steps, only forward, rank 0's.
    plan = re.search(r"plan: (\d+) epochs x (\d+) steps per epoch", text)
    total = int(plan.group(1)) * int(plan.group(2))
    rank0_steps = [int(m.group(1)) + 1 for m in re.finditer(r"^\[default0\]:.*train/loss=.*global_step=(\d+)",
                                                           text, re.M)]
    assert rank0_steps and rank0_steps[-1] == total
    seen = [s["training"]["step"] for s in live_progress(log.read_bytes()) if s.get("training")]
    assert seen and all(a <= b for a, b in zip(seen, seen[1:])), seen
    assert set(seen) <= set(rank0_steps) | {total} and seen[-1] == total


def extract(data, out: Path, log: Path, *extra: str) -> subprocess.CompletedProcess:
    return stage("extract", "--backend", "transformers", "--device", "cpu", "--model", str(data["model"]),
                 "--data", str(data["prepared"]), "--out", str(out), "--aux-layers", foresight_data.AUX,
                 "--world-size", "2", "--rank", "all", *extra, log=log)


def shard_of(data, rank: int) -> list[int]:
    from eaglelab.stages.extract import rank_indices

    n = manifest.read(data["prepared"])["counts"]["samples"]
    return rank_indices(n, None, 2, rank)


def files(out: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("hs_*.safetensors")}


def extraction_bar(log: bytes) -> list[dict]:
    return [s for s in live_progress(log) if s["label"] == "Extracting hidden states"]


def test_sharded_extraction_on_one_host(data, tmp_path):
    out, log = tmp_path / "hs", tmp_path / "extract.log"
    p = extract(data, out, log)
    text = log.read_text(errors="replace")
    assert p.returncode == 0, text[-4000:]
    n = manifest.read(data["prepared"])["counts"]["samples"]
    doc = manifest.read(out)
    assert doc["counts"]["samples"] == n and len(doc["files"]) == n and manifest.is_complete(out, doc["params"])
    assert sorted(files(out)) == sorted(f"hs_{i}.safetensors" for i in range(n))
    for r in (0, 1):
        assert manifest.read(out, f"manifest.rank{r}.json")["counts"]["samples"] == len(shard_of(data, r))
        assert f"[rank{r}]: extract: Processing {len(shard_of(data, r))} samples" in text
    assert text.count("Data generation complete!") == 1  # the parent's: a shard's end is not the stage's
    bar = extraction_bar(log.read_bytes())
    counts = [b["n"] for b in bar]
    assert bar and all(b["prefix"] is None and b["total"] == n for b in bar)
    assert all(a <= b for a, b in zip(counts, counts[1:])) and counts[-1] == n, counts


def rank1_order(data) -> list[int]:
    """Rank 1's samples in the order it works through them (longest first, as run_transformers)."""
    from datasets import load_from_disk

    lens = load_from_disk(str(data["prepared"]))["seq_len"]
    return sorted(shard_of(data, 1), key=lambda i: -int(lens[i]))


def test_a_shard_failing_midway_is_named_with_its_last_lines(data, tmp_path):
    out, log = tmp_path / "hs", tmp_path / "extract.log"
    out.mkdir()
    order = rank1_order(data)
    blocked = order[len(order) // 2]
    (out / f".hs_{blocked}.safetensors.tmp").mkdir()  # its write fails: rank 1 dies half way
    p = extract(data, out, log, "--writer-threads", "0")
    text = log.read_text(errors="replace")
    assert p.returncode != 0
    assert "rank 1 failed (exit 1); its last lines:" in text and "rank 0 failed" not in text, text[-3000:]
    assert re.search(r"\[rank1\]: .*(IsADirectoryError|Is a directory)", text), text[-3000:]
    assert re.search(r"^    \[rank1\]: .*Is a directory", text, re.M), text[-3000:]  # in the parent's error
    assert manifest.read(out, "manifest.rank0.json") is not None and manifest.read(out) is None
    assert sorted(files(out)) == sorted(f"hs_{i}.safetensors" for i in shard_of(data, 0) + order[:len(order) // 2])


def test_killed_midway_the_rerun_redoes_only_what_each_shard_lacks(data, tmp_path):
    out, log = tmp_path / "hs", tmp_path / "extract.log"
    out.mkdir()
    order = rank1_order(data)
    k = len(order) // 2
    fifo = out / f".hs_{order[k]}.safetensors.tmp"
    os.mkfifo(fifo)  # rank 1's write of its k-th sample blocks (no reader): killed there, midway
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"), COLUMNS="1000", PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "eaglelab.stages.extract", "--backend", "transformers", "--device", "cpu",
            "--model", str(data["model"]), "--data", str(data["prepared"]), "--out", str(out),
            "--aux-layers", foresight_data.AUX, "--world-size", "2", "--rank", "all", "--writer-threads", "0"]
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        def midway() -> bool:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            return (out / "manifest.rank0.json").exists() and all((out / f"hs_{i}.safetensors").exists()
                                                                  for i in order[:k])
        for _ in range(3000):  # polls, not a time limit on the stage: it blocks at the fifo for good
            if midway():
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"never got midway: {log.read_text(errors='replace')[-3000:]}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group, as `lab stop` ends with
        proc.wait()
    fifo.unlink()
    before = files(out)
    assert sorted(before) == sorted(f"hs_{i}.safetensors" for i in shard_of(data, 0) + order[:k])
    assert manifest.read(out) is None

    p = extract(data, out, log)
    text = log.read_text(errors="replace")
    assert p.returncode == 0, text[-4000:]
    assert f"[rank1]: extract: Processing {len(order) - k} samples" in text
    assert "[rank0]: extract: Processing" not in text and re.search(r"\[rank0\]: extract: .* is complete", text)
    after = files(out)
    assert {name: after[name] for name in before} == before  # nothing done was redone: same inode, same mtime
    n = manifest.read(data["prepared"])["counts"]["samples"]
    assert len(after) == n and manifest.read(out)["counts"]["samples"] == n
    bar = extraction_bar(log.read_bytes())
    counts = [b["n"] for b in bar]
    assert counts[0] == n - (len(order) - k) and counts[-1] == n, counts
    assert all(a <= b for a, b in zip(counts, counts[1:])), counts
    r0 = len(shard_of(data, 0))
    assert bar[-1]["postfix"] == {"r0": f"{r0}/{r0}", "r1": f"{len(order)}/{len(order)}"}
