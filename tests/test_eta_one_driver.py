"""One estimator: a log tailed live (the tailer writing state.json, as the page reads it) and the
same log through `lab eta replay` (what the benchmarks score) give the same ETAs, frame by frame."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from eaglelab.eta.replay import replay
from eaglelab.host.tail.run import RunFollower

ROOT = Path(__file__).resolve().parents[1]
REAL = sorted((ROOT / "bench" / "corpus" / "real").glob("*.log"))
FIELDS = ("label", "n", "total", "eta_s", "eta_low_s", "eta_high_s")


def tqdm_training_log() -> str:
    """A training log as tqdm writes it to a file (its own format, a simulated clock whose rate
    drifts), with a metric record after every 10 frames, one glued to a frame, and a short
    checkpoint bar in the middle."""
    from tqdm import tqdm

    rng = np.random.default_rng(7)
    clock = [0.0]
    buf = io.StringIO()
    bar = tqdm(total=80, desc="Training", file=buf, mininterval=0, miniters=1, ascii=True, ncols=100)
    bar._time = lambda: clock[0]  # tqdm reads its clock through this attribute
    bar.start_t = bar.last_print_t = 0.0
    for i in range(80):
        clock[0] += float(rng.lognormal(0.3 + i / 80, 0.3))
        bar.update(1)
        if i % 10 == 9:
            glue = "" if i != 39 else "2026-07-07 22:20:44 | INFO | __main__ | glued right after a frame"
            buf.write(f"{glue}\nepoch=0, train/loss={2.0 - i / 80:.3f}, global_step={i}\n")
    bar.close()
    return buf.getvalue()


def live_progress(tmp_path: Path, text: str) -> list[dict]:
    """The state JSON's progress after each line is appended to a run's output.log and tailed."""
    run = tmp_path / "run"
    run.mkdir()
    log = run / "output.log"
    fol = RunFollower(run)
    seen = []
    with open(log, "ab") as f:
        for line in text.splitlines(keepends=True):
            f.write(line.encode())
            f.flush()
            fol.read()
            prog = fol.snapshot()["progress"]
            seen.append(None if prog is None else {k: prog[k] for k in FIELDS})
    return seen


def replayed_progress(text: str) -> list[dict]:
    """The last replay row up to each line: the bar the snapshot shows is the last one observed."""
    lines = text.splitlines(keepends=True)
    rows = list(replay(lines))
    out, last, i = [], None, 0
    for lineno in range(1, len(lines) + 1):
        while i < len(rows) and rows[i].line <= lineno:
            last = rows[i].public()
            i += 1
        out.append(None if last is None else {k: last[k] for k in FIELDS})
    return out


@pytest.mark.parametrize("name", ["tqdm-training"] + [p.name for p in REAL])
def test_live_tail_and_replay_give_identical_etas(tmp_path, name):
    text = tqdm_training_log() if name == "tqdm-training" else (ROOT / "bench/corpus/real" / name).read_text()
    live, replayed = live_progress(tmp_path, text), replayed_progress(text)
    assert any(p and p["eta_s"] not in (None, 0.0) for p in live)  # there is something to compare
    assert live == replayed


@pytest.mark.parametrize("path", REAL[:3], ids=lambda p: p.name)
def test_a_replay_without_estimates_reads_the_same_frames(path: Path):
    # the benchmarks read each log's counts and clocks with estimate=False (the estimator is most of a
    # replay's time); those rows must be the estimating replay's, ETAs aside
    lines = path.read_text(errors="replace").split("\n")
    full = list(replay(lines))
    bare = list(replay(lines, estimate=False))
    assert full and len(bare) == len(full)
    keep = ("line", "key", "instance", "label", "n", "total", "elapsed_s", "tqdm_eta_s", "lane")
    assert [[getattr(r, k) for k in keep] for r in bare] == [[getattr(r, k) for k in keep] for r in full]
    assert all(r.eta_s is None and r.ema_eta_s is None for r in bare)
    assert any(r.eta_s is not None for r in full)
