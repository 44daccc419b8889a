"""A corpus kept outside the repository (`make bench-outside CORPUS=DIR`): both benches score its logs
as one held-out part, and a log whose bytes the repository already holds is left out and named."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_eta  # noqa: E402 - bench/ goes on sys.path just above
import bench_holdout  # noqa: E402 - likewise

COMMITTED = "bench/corpus/public/triforce-long-context-decode-bench-500-oom-at-315.log"
OOM_END = ("Traceback (most recent call last):\n  File \"load.py\", line 3, in <module>\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Two logs nobody here has seen (tqdm's own frames on a simulated clock), one in a subfolder, and
    a copy of a committed corpus log under another name."""
    d = tmp_path / "outside"
    (d / "sub").mkdir(parents=True)
    rng = np.random.default_rng(3)
    (d / "steady.log").write_text(bench_eta.tqdm_log(0.5 * rng.lognormal(0.0, 0.1, 150), "Training"))
    (d / "sub" / "speedup.log").write_text(
        bench_eta.tqdm_log(np.r_[np.full(10, 8.0), np.full(40, 2.0)], "Loading checkpoint shards") + OOM_END)
    shutil.copy(ROOT / COMMITTED, d / "renamed-copy.log")
    return d


def test_the_eta_bench_scores_an_outside_corpus_and_leaves_out_what_the_repo_holds(outside, capsys, monkeypatch):
    # the split's tuning logs make only the prior column (replaying them all takes minutes): none here
    monkeypatch.setattr(bench_eta, "load_split", lambda: [])
    out = bench_eta.run(corpus=outside, jobs=1)
    printed = capsys.readouterr().out
    assert "renamed-copy.log" in printed.split("\n", 1)[0] and "not unseen" in printed
    assert "split outside: 2 logs, 2 bars scored" in printed
    assert out["all"]["bars"] == 2 and out["complete"]["bars"] == 2  # both reach their totals
    assert out["rate change"]["bars"] == 1 and out["long steady"]["bars"] == 1


def test_the_reasons_bench_reads_the_outside_labels(outside):
    (outside / "LABELS.tsv").write_text(
        "path\trepo\turl\tfailed\treason\tprogress\tnote\n"
        "steady.log\ta/b\thttps://example.invalid/1\t0\t-\t150/150\ta steady bar\n"
        "sub/speedup.log\tc/d\thttps://example.invalid/2\t1\tcuda_oom\t50/50\tshards, then an OOM\n"
        "renamed-copy.log\te/f\thttps://example.invalid/3\t1\tcuda_oom\t315/500\ta committed log again\n")
    labels, labelled, known = bench_holdout.outside_labels(outside)
    assert labelled and known == [outside / "renamed-copy.log"]
    assert sorted(Path(lab.path).name for lab in labels) == ["speedup.log", "steady.log"]
    score = bench_holdout.score_parse(labels)
    assert (score.failed, score.detected, score.right_reason, score.false_alarms) == (1, 1, 1, 0), score.misses
    assert (score.progress_right, score.with_bar) == (2, 2), score.misses

    run = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_holdout.py"), "--corpus", str(outside)],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert f"corpus {outside} (outside the repository): 2 logs" in run
    assert "right reason 1.00 (1/1)" in run and "progress right 1.00 (2/2)" in run
    assert "eta: 2 bars scored" in run


def test_an_unlabelled_or_missing_corpus(outside, tmp_path):
    labels, labelled, _ = bench_holdout.outside_labels(outside)
    assert not labelled and len(labels) == 2  # every *.log but the copy: the ETA alone is scored
    with pytest.raises(SystemExit, match="no such directory"):
        bench_eta.outside_logs(tmp_path / "nowhere")
    (outside / "LABELS.tsv").write_text("path\trepo\turl\tfailed\treason\tprogress\tnote\n"
                                        "gone.log\ta/b\tu\t0\t-\t-\tx\n")
    with pytest.raises(SystemExit, match="gone.log"):
        bench_holdout.outside_labels(outside)
