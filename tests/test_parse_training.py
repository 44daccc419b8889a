"""Training progress from what trainers log (eaglelab.host.parse.training through the state
machine): steps, epochs, totals, and the stage's main progress while the log goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglelab.host.parse.state import LogState
from eaglelab.host.tail.frames import FrameSplitter
from eaglelab.host.tail.whole import bar_eta

FIXTURES = Path(__file__).parent / "fixtures" / "logs"


def live(text: str) -> list[dict]:
    """Snapshots after every line, read as the tailer reads a growing log (no end_of_log)."""
    st = LogState(bar_eta=bar_eta)
    sp = FrameSplitter(st.feed_line, st.feed_frame, sample_bytes=0)
    out = []
    for line in text.splitlines(keepends=True):
        sp.feed(line.encode())
        out.append(st.snapshot())
    return out


def test_speculators_steps_are_the_train_stages_progress_not_the_checkpoint_bar():
    snaps = live((FIXTURES / "recorded" / "h200" / "train.log").read_text())
    steps = [s["progress"] for s in snaps if s["progress"] and s["progress"]["label"] == "training steps"]
    assert steps, "no training-steps progress while the log went on"
    # max_steps=30 from speculators' config dump; global_step is logged before it moves on
    assert {p["total"] for p in steps} == {30} and steps[0]["n"] == 1 and steps[-1]["n"] == 28
    with_eta = [p for p in steps if p["eta_s"] is not None]
    assert with_eta and all(p["eta_low_s"] <= p["eta_s"] <= p["eta_high_s"] for p in with_eta)
    assert snaps[-1]["training"]["step"] == 28 and snaps[-1]["training"]["epochs"] == 1


def test_checkpoint_bar_between_epochs_does_not_replace_the_steps():
    log = ["train: plan: 2 epochs x 4 steps per epoch\n", "[10:00:00] INFO     Training epoch 1/2 started\n"]
    log += [f"[10:00:{10 + 2 * gs:02d}] INFO     train/loss=1.0, epoch=0, lr=1e-3, global_step={gs}\n" for gs in range(4)]
    log += ["           INFO     Training epoch 1/2 completed\n", "           INFO     Saving checkpoint to /ck/0\n",
            "Writing model shards: 100%|#| 1/1 [00:00<00:00, 23.15it/s]\n"]
    snaps = live("".join(log))
    prog = snaps[-1]["progress"]
    assert snaps[-1]["progress_bars"][0]["label"] == "Writing model shards"
    assert (prog["label"], prog["n"], prog["total"]) == ("training steps", 4, 8) and prog["eta_s"] is not None


def test_plan_line_gives_total_steps_from_the_first_step_and_epochs_learned_otherwise():
    log = ["train: plan: 3 epochs x 4 steps per epoch\n"]
    for gs in range(12):
        log.append(f"[10:00:{10 + 2 * gs:02d}] INFO     train/loss=1.0, epoch={gs // 4}, lr=1e-3, global_step={gs}\n")
    snaps = live("".join(log))
    first = snaps[1]["progress"]
    assert (first["label"], first["n"], first["total"]) == ("training steps", 1, 12)
    mid = snaps[6]["progress"]
    assert mid["eta_s"] is not None and abs(mid["eta_s"] - 7 * 2.0) <= 3.0  # 2 s a step, 7 steps left
    # Without a plan: the epochs from `Training epoch 1/3 started`, steps per epoch when epoch 2 starts.
    bare = ["[10:00:00] INFO     Training epoch 1/3 started\n"] + log[1:]
    snaps = live("".join(bare))
    assert snaps[4]["training"]["total_steps"] is None and snaps[4]["progress"]["total"] is None
    assert snaps[5]["training"]["steps_per_epoch"] == 4 and snaps[5]["progress"]["total"] == 12


def test_hf_banner_and_lightning_epoch_bars():
    hf = live("***** Running training *****\n  Num Epochs = 3\n  Total optimization steps = 500\n")
    assert "training" not in hf[-1]  # a plan alone: no step seen, nothing to show yet
    bars = "".join(f"Epoch {e}: {10 * n}%|#| {n}/10 [00:{e * 10 + n:02d}<00:05, 1.00it/s, v_num=0]\n"
                   for e in range(2) for n in range(1, 11 if e == 0 else 6))
    snaps = live(bars)
    t = snaps[-1]["training"]
    assert (t["source"], t["step"], t["steps_per_epoch"], t["epoch"]) == ("epoch bars", 15, 10, 1)


def test_a_finished_sub_bar_does_not_replace_the_unfinished_bar_it_ran_in():
    text = "".join(f"Training: {k}%| | {k}/100 [00:{k:02d}<01:40, 1.00s/it]\n" for k in range(1, 51))
    text += "Writing model shards: 100%|#| 1/1 [00:00<00:00, 23.15it/s]\n"
    snaps = live(text)
    assert snaps[-1]["progress"]["label"] == "Training" and snaps[-1]["progress"]["n"] == 50
    st = LogState(bar_eta=bar_eta)  # a complete log (lab parse): the last bar it printed, as before
    sp = FrameSplitter(st.feed_line, st.feed_frame)
    sp.feed(text.encode())
    st.end_of_log()
    assert st.snapshot()["progress"]["label"] == "Writing model shards"


def _two_ranks(prefix: str) -> str:
    """A trainer that logs on every rank (HF/Lightning-style), rank 1 a step behind rank 0, under a
    launcher's prefix; rank 1 also announces a plan of its own (its shard's steps)."""
    p0, p1 = prefix.format(0), prefix.format(1)
    log = [f"{p0}train: plan: 2 epochs x 4 steps per epoch\n", f"{p1}train: plan: 2 epochs x 3 steps per epoch\n"]
    for gs in range(8):
        log.append(f"{p0}[10:00:{10 + 2 * gs:02d}] INFO     train/loss=1.0, epoch={gs // 4}, global_step={gs}\n")
        if gs:
            log.append(f"{p1}[10:00:{11 + 2 * gs:02d}] INFO     train/loss=2.0, epoch={(gs - 1) // 4}, "
                       f"global_step={gs - 1}\n")
        log.append(f"{p1}Epoch 0:  {10 * gs}%|#   | {gs}/9 [00:0{gs}<00:09, 1.00it/s]\n")
    return "".join(log)


@pytest.mark.parametrize("prefix", ["[default{}]:", "[rank{}]: ", "[local_rank{}]:", "{}: ", "[1,{}]<stdout>:"])
def test_rank_0_alone_drives_the_progress_of_a_distributed_training(prefix):
    snaps = live(_two_ranks(prefix))
    steps = [s["training"]["step"] for s in snaps if s.get("training")]
    assert steps == sorted(steps) and steps[-1] == 8, steps  # never back to rank 1's step
    assert snaps[-1]["training"]["total_steps"] == 8  # rank 0's plan, not rank 1's
    progress = [s["progress"] for s in snaps if s["progress"]]
    assert all(p["label"] == "training steps" for p in progress[2:]), [p["label"] for p in progress]
    assert [x for _, x in snaps[-1]["metrics"]["train/loss"]] == [1.0] * 8  # rank 0's curve alone
    assert any(b["prefix"] == prefix.format(1).strip() for b in snaps[-1]["progress_bars"])  # kept, not shown
