"""`make demo-spread`: the demo pipeline over three real ssh hosts with no shared filesystem
(bin/demo-spread). Every output another host reads is moved and verified, and the summary at the
end has every figure, read from the hosts that hold them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The whole demo over three hosts, with the pilot and both smokes beside it, at the sizes of
# tests/demo_lab.py (what this checks is the placement and the moves, not the figures: the demo's
# own sizes made eval alone 340 s of its 800): ~8 min on an idle 2-core CI machine, more when loaded;
# the subprocess has its own 2400 s limit.
pytestmark = pytest.mark.timeout(2700)
SIZES = {"epochs": "3", "eval_limit": "4", "eval_max_tokens": "32"}


def test_demo_over_three_hosts_moves_the_data_and_ends_with_the_full_summary(tmp_path):
    out = tmp_path / "spread.json"
    p = subprocess.run([sys.executable, str(REPO / "bin" / "demo-spread"), "--root", str(tmp_path / "spread"),
                        "--json-summary", str(out), *(f"--set={k}={v}" for k, v in SIZES.items())], capture_output=True, text=True, timeout=2400,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    doc = json.loads(out.read_text())
    stages = {s["stage"]: s for s in doc["summary"]["stages"]}
    # train's smoke starts with extract and waits on h2 for its first samples: it always runs beside it
    not_completed = {n: (s["state"], s["run"]) for n, s in stages.items() if s["state"] != "completed"}
    assert not not_completed, (not_completed, p.stdout[-4000:])
    assert {stages[n]["host"] for n in ("synth", "extract", "train", "eval")} == {"h1", "h2", "h3"}
    moved = {t["stage"]: t for t in doc["transfers"]}
    assert {"move-synth-to-h2", "move-model-to-h2", "move-extract-to-h3", "move-vocab-to-h3",
            "move-prepare-to-h3", "move-model-to-h3", "move-eval_baseline-to-h3"} <= set(moved), moved
    assert all(t["bytes"] > 0 for t in moved.values())
    assert moved["move-extract-to-h3"]["to"] == "h3"
    headline = doc["summary"]["headline"]  # from manifests on h2 (vocab) and h3 (eval)
    for key in ("coverage", "acceptance_rate", "mean_acceptance_length", "speedup", "verdict"):
        assert headline.get(key) is not None, headline
    assert "transfers moved" in p.stdout
    fc = doc["summary"]["forecast"]  # the eval's manifest, read on h3 over ssh
    assert fc["source"] == "eval" and fc["acceptance_rate"] == headline["acceptance_rate"], fc
    assert "train WILL FAIL" not in p.stdout, p.stdout[-3000:]
    assert "side job smoke-train completed" in p.stdout, p.stdout[-3000:]
