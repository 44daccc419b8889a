"""bench_holdout.py's parse scoring reports a listed part apart (a round's new logs: `--apart LIST`)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_holdout  # noqa: E402 - bench/ goes on sys.path just above

# two tuning logs with labels a person read: a CUDA OOM the parser names, and a silent death
# (the log stops mid-bar with no error) that the log alone cannot show
OOM = "bench/corpus/public/triforce-long-context-decode-bench-500-oom-at-315.log"
SILENT = "bench/corpus/public/analysis-synthesis-vae-eval-amazon-7x100-lost-19of100.log"


def test_listed_logs_are_scored_apart_with_their_misses(tmp_path):
    labels = [lab for lab in bench_holdout.load_labels() if lab.path in (OOM, SILENT)]
    assert {lab.reason for lab in labels} == {"cuda_oom", "lost"}
    listing = tmp_path / "new.txt"
    listing.write_text(f"# a round's new logs\n{OOM}\n\n{SILENT}\nbench/corpus/public/not-in-the-labels.log\n")
    mine, score = bench_holdout.score_apart(labels, listing)
    assert sorted(lab.path for lab in mine) == sorted([OOM, SILENT])
    assert (score.failed, score.detected, score.right_reason) == (2, 1, 1)
    assert score.misses == [f"{SILENT}: want failed/lost, got running/None"]
    assert (score.progress_right, score.with_bar) == (2, 2)
    only_oom = tmp_path / "one.txt"
    only_oom.write_text(OOM + "\n")
    mine, score = bench_holdout.score_apart(labels, only_oom)
    assert [lab.path for lab in mine] == [OOM] and score.right_reason == 1 and not score.misses
