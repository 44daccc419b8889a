"""The offline acceptance estimate (eaglelab.stages.acceptance): its arithmetic on hand-made
drafts, and on a real tiny drafter trained by the train stage, whose hook writes one estimate per
checkpoint (acceptance.jsonl + a metric line the log parser turns into the train page's curve)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from eaglelab.host.parse.state import LogState
from eaglelab.stages import acceptance


def test_summary_matches_vllms_counters():
    # 10 starts; steps 0..2 all-right prefixes: 8, 5, 2 -> vLLM: rate = 15/30, mean length 1 + 1.5
    s = acceptance.summarize([8, 5, 2], 10, 3)
    assert s["per_position"] == [0.8, 0.5, 0.2]
    assert math.isclose(s["acceptance_rate"], 0.5) and math.isclose(s["mean_acceptance_length"], 2.5)
    assert acceptance.summarize([0, 0], 0, 2)["acceptance_rate"] == 0.0
    with pytest.raises(ValueError, match="k=0"):
        acceptance.summarize([], 5, 0)


def test_prefix_counts_stop_at_the_first_miss_and_skip_unsupervised_starts():
    nxt = torch.tensor([5, 6, 7, 8, 9, 10])
    mask = torch.tensor([0, 1, 1, 1, 1, 1])
    # step s from start t should equal nxt[t+s]
    step0 = torch.tensor([0, 6, 7, 0, 9, 10])    # right at t=1,2,4
    step1 = torch.tensor([0, 7, 0, 9, 10, 0])    # right at t=1,3,4 (t=3 after a miss at step 0: not accepted)
    sums, starts = acceptance.prefix_correct_counts([step0, step1], nxt, mask)
    assert starts == 4                 # t=1..4 (t=0 unsupervised; t=5 has no room for 2 tokens)
    assert sums == [3.0, 2.0]          # step 0: t=1,2,4; steps 0 and 1: t=1,4


def test_held_out_split_is_speculators_validation_split():
    assert list(acceptance.held_out_indices(24, 0.9)) == [21, 22, 23]


@pytest.fixture
def trained(tiny_drafter):
    """A drafter trained 2 epochs by the train stage on the tiny target's own greedy answers
    (the session's, tests/conftest.py: test_serve_smoke serves the same one)."""
    return tiny_drafter


SLOW = pytest.mark.timeout(1800)  # builds data and trains 2 epochs: ~4 min idle, far more on a loaded machine


@SLOW
def test_every_checkpoint_gets_an_estimate_on_held_out_rows(trained):
    docs = acceptance.read(trained["ck"])
    assert [d["epoch"] for d in docs] == [0, 1]
    for d in docs:
        assert d["k"] == 3 and d["samples"] == 2 and d["held_out"] == [14, 15]   # 16 rows, ratio 0.9
        assert 0.0 <= d["acceptance_rate"] <= 1.0
        assert math.isclose(d["mean_acceptance_length"], 1 + 3 * d["acceptance_rate"])
        assert d["per_position"] == sorted(d["per_position"], reverse=True)   # prefixes only shrink
    assert docs[-1]["per_position"][0] > 0.02   # it learned something in 2 epochs (a fresh drafter: ~0)


@SLOW
def test_the_estimate_agrees_with_speculators_validation_accuracy(trained):
    """Position 0 of the estimate is speculators' val full_acc_0 on the same held-out rows."""
    last = acceptance.read(trained["ck"])[-1]
    val = [line for line in trained["log"].splitlines() if "val/full_acc_0_epoch=" in line][-1]
    full_acc_0 = float(val.split("val/full_acc_0_epoch=")[1].split(",")[0])
    assert abs(last["per_position"][0] - full_acc_0) < 0.02


@SLOW
def test_a_shuffled_drafter_scores_near_zero(trained):
    """The same checkpoint with its output rows permuted: the estimate must see the damage."""
    drafter = acceptance.load_checkpoint(trained["ck"] / "1")
    with torch.no_grad():
        perm = list(range(drafter.lm_head.weight.shape[0]))
        random.Random(0).shuffle(perm)
        drafter.lm_head.weight.copy_(drafter.lm_head.weight[perm])
    lm_head = acceptance.verifier_lm_head(trained["model"], "cpu")
    good = acceptance.read(trained["ck"])[-1]
    bad = acceptance.estimate(drafter, lm_head, acceptance.held_out_samples(
        trained["prepared"], trained["hidden_states"], 0.9, None), 3)
    assert bad["starts"] == good["starts"]
    assert bad["acceptance_rate"] < good["acceptance_rate"] / 2


@SLOW
def test_the_log_line_becomes_the_train_pages_curve(trained):
    lines = [line for line in trained["log"].splitlines() if "acceptance/rate=" in line]
    assert len(lines) == 2
    st = LogState()
    for i, line in enumerate(trained["log"].splitlines()):
        st.feed_line(line, i + 1)
    metrics = st.snapshot()["metrics"]
    assert len(metrics["acceptance/rate"]) == 2 and len(metrics["acceptance/mean_length"]) == 2
    assert metrics["acceptance/rate"][-1][1] == pytest.approx(acceptance.read(trained["ck"])[-1]["acceptance_rate"],
                                                              abs=1e-4)
