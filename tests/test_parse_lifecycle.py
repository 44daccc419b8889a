"""Lifecycle recognizers: log headers, vLLM, speculators, eaglelab's own markers, stall."""

from __future__ import annotations

import pytest

from eaglelab.host.parse import markers
from eaglelab.host.parse.records import LogClock, parse_record
from eaglelab.host.parse.stall import STALL_MIN_S, check_stall
from eaglelab.host.parse.state import LogState
from eaglelab.host.tail.whole import parse_bytes


@pytest.mark.parametrize("line,level,message,time", [
    ("INFO 05-06 20:59:57 [default_loader.py:384] Loading weights took 24.84 seconds", "INFO", "Loading weights took 24.84 seconds", "20:59:57"),
    ("INFO 08-17 23:29:22 model_runner.py:266] Loading model weights took 1.5874 GB", "INFO", "Loading model weights took 1.5874 GB", "23:29:22"),
    ("WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 1 closing signal SIGTERM", "WARNING", "Sending process 1 closing signal SIGTERM", None),
    ("INFO:     Application startup complete.", "INFO", "Application startup complete.", None),
    ("2024-12-20 00:49:31,004 - app.pipelines.llm - INFO - Initializing LLM pipeline", "INFO", "Initializing LLM pipeline", "00:49:31"),
    ("2026-07-07 22:20:44 | INFO | __main__ | epoch=0 step=14", "INFO", "epoch=0 step=14", "22:20:44"),
    ("[20:51:04] INFO     train/loss=1.000, global_step=3                     trainer.py:587", "INFO", "train/loss=1.000, global_step=3", "20:51:04"),
    ("           INFO     Training epoch 1/3 started       trainer.py:737", "INFO", "Training epoch 1/3 started", None),
    ("[E429 13:55:49.384372190 ProcessGroupNCCL.cpp:1743] watchdog got stuck", "ERROR", "watchdog got stuck", "13:55:49"),
    ("E0325 20:57:27.620000 2606 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9)", "ERROR", "failed (exitcode: -9)", "20:57:27"),
    ("Traceback (most recent call last):", None, "Traceback (most recent call last):", None),
])
def test_record_headers(line, level, message, time):
    r = parse_record(line)
    assert (r.level, r.message, r.time) == (level, message, time)


def test_log_clock_spans_midnight_and_mixed_formats():
    c = LogClock()
    t0 = c.seconds(parse_record("[23:59:50] INFO     a"))
    t1 = c.seconds(parse_record("[00:00:10] INFO     b"))
    assert t1 - t0 == 20
    v0 = c.seconds(parse_record("INFO 05-06 20:59:57 [x.py:1] a"))
    v1 = c.seconds(parse_record("INFO 05-06 21:00:16 [x.py:1] b"))
    assert v1 - v0 == 19


SPECULATORS_TRAIN = """\
[10:00:00] INFO     Training epoch 1/2 started                                  trainer.py:737
[10:00:01] INFO     train/loss=9.000, train/full_acc_0=0.010, profile/tokens_per_s=1.20e+04, epoch=0, lr=1.00e-04, global_step=0   trainer.py:587
[10:00:02] INFO     train/loss=7.500, train/full_acc_0=0.050, profile/tokens_per_s=1.30e+04, epoch=0, lr=1.00e-04, global_step=1   trainer.py:587
[10:00:03] INFO     Training epoch 1/2 completed                                trainer.py:739
[10:00:03] INFO     Saving checkpoint to ck/0                                   trainer.py:689
[10:00:05] INFO     Checkpoint saved to ck/0                                    trainer.py:707
[10:00:05] INFO     Validation epoch 1/2 started                                trainer.py:754
[10:00:06] INFO     val/loss_epoch=7.000, val/full_acc_0_epoch=0.080, epoch=0   trainer.py:671
[10:00:06] INFO     Validation epoch 1/2 completed                              trainer.py:756
[10:00:06] INFO     Training epoch 2/2 started                                  trainer.py:737
[10:00:09] INFO     Training epoch 2/2 completed                                trainer.py:739
"""


def test_speculators_training_phases_metrics_and_end():
    s = parse_bytes(SPECULATORS_TRAIN.encode())
    assert s["state"] == "completed" and s["end_marker"] == "Training epoch 2/2 completed"
    names = [(p["name"], p.get("detail"), p["duration_s"]) for p in s["phases"]]
    assert names == [("training", "epoch 1/2", 3.0), ("checkpointing", "ck/0", 2.0),
                     ("validation", "epoch 1/2", 1.0), ("training", "epoch 2/2", 3.0)]
    assert s["metrics"]["train/loss"] == [[0, 9.0], [1, 7.5]]
    assert s["metrics"]["profile/tokens_per_s"] == [[0, 12000.0], [1, 13000.0]]
    assert s["metrics"]["val/loss_epoch"] == [[0, 7.0]]
    assert "global_step" not in s["metrics"]


def test_speculators_data_generation():
    log = ("[09:00:00] INFO     EAGLE Offline Data Generation     generate_offline_data.py:496\n"
           "[09:00:01] INFO     Found 12 existing samples for rank 0.     generate_offline_data.py:60\n"
           "[09:00:01] INFO     Processing 52 samples     generate_offline_data.py:289\n"
           "100%|##########| 52/52 [00:19<00:00,  2.70it/s, ok=52, err=0, rps=2.7, vllm=310ms, write=12ms]\n"
           "[09:00:20] INFO     Timing: 19.3s elapsed, 2.7 samples/s, avg vLLM request 310 ms, avg file write 12 ms   generate_offline_data.py:356\n"
           "[09:00:20] INFO     Saved 52 new data points to out/hidden_states     generate_offline_data.py:366\n"
           "[09:00:20] INFO     Data generation complete!     generate_offline_data.py:522\n")
    s = parse_bytes(log.encode())
    assert s["state"] == "completed"
    assert [p["name"] for p in s["phases"]] == ["data_generation_setup", "extracting"]
    assert s["phases"][1]["duration_s"] == 19.0
    assert s["metrics"]["datagen/samples_to_process"] == [[0, 52.0]]
    assert s["metrics"]["datagen/samples_saved"] == [[0, 52.0]]
    assert s["progress"]["postfix"] == {"ok": "52", "err": "0", "rps": "2.7", "vllm": "310ms", "write": "12ms"}


def test_vllm_ready_is_startup_not_shutdown():
    up = parse_bytes(b"INFO:     Started server process [1]\nINFO:     Application startup complete.\n")
    assert up["ready"] is True and up["phase"] == "serving" and up["state"] == "running"
    down = parse_bytes(b"INFO:     Shutting down\nINFO:     Application shutdown complete.\nINFO:     Finished server process [1]\n")
    assert down["ready"] is False and down["state"] == "completed" and down["end_marker"] is None


def test_eaglelab_markers_round_trip():
    lines = [markers.phase_started("vocab", "draft 32000"), markers.metric_line("vocab/coverage", 0.983, 0),
             markers.phase_completed("vocab"), markers.ready_line(), markers.done_line()]
    s = parse_bytes(("\n".join(lines) + "\n").encode())
    assert s["state"] == "completed" and s["ready"]
    assert s["phases"][0]["name"] == "vocab" and s["phases"][0]["detail"] == "draft 32000"
    assert s["metrics"]["vocab/coverage"] == [[0, 0.983]]
    f = parse_bytes((markers.failed_line("disk_full", "12 GB free on /data, 828 GB needed") + "\n").encode())
    assert f["failure"]["reason"] == "disk_full"
    with pytest.raises(ValueError, match="not one of"):
        markers.failed_line("oops", "x")


def test_vllm_stats_with_requests_running_and_no_throughput_is_a_stall():
    zero = ("(APIServer pid=1) INFO 04-28 22:54:%02d [loggers.py:257] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            "Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 14 reqs, GPU KV cache usage: 76.5%%, "
            "Prefix cache hit rate: 92.0%%\n")
    moving = zero.replace("generation throughput: 0.0", "generation throughput: 5.4")
    assert parse_bytes("".join(zero % s for s in (2, 12)).encode())["state"] == "running"
    stuck = parse_bytes("".join(zero % s for s in (2, 12, 22)).encode())
    assert stuck["state"] == "stalled" and stuck["stall"]["reason"] == "no_throughput"
    back = parse_bytes(("".join(zero % s for s in (2, 12, 22)) + moving % 32).encode())
    assert back["state"] == "running"


def test_stall_from_the_bars_own_pace_with_a_clock():
    st = LogState()
    st.feed_line("Loading safetensors checkpoint shards:  10% Completed | 1/10 [00:30<04:30, 30.00s/it]", 1, now=1000.0)
    assert st.snapshot(now=1000.0 + 299, alive=True)["state"] == "running"      # limit max(300, 10 x 30 s)
    s = st.snapshot(now=1000.0 + 301, alive=True)
    assert s["state"] == "stalled" and s["stall"]["reason"] == "no_progress"
    assert st.snapshot(now=1000.0 + 301, alive=False)["state"] == "running"      # a dead process is not "stalled"
    st.feed_line("Loading safetensors checkpoint shards:  20% Completed | 2/10 [05:02<04:00, 30.00s/it]", 2, now=1302.0)
    assert st.snapshot(now=1303.0, alive=True)["state"] == "running"


def test_stall_rules_directly():
    assert check_stall(now=100.0, last_activity_at=0.0, bar_unfinished=True, bar_s_per_it=120.0,
                       stuck_stats_lines=0) is None                               # 10 x 120 s not reached
    assert check_stall(now=STALL_MIN_S + 1, last_activity_at=0.0, bar_unfinished=False, bar_s_per_it=None,
                       stuck_stats_lines=0) is None                               # no bar, no history: no opinion
    s = check_stall(now=4000.0, last_activity_at=3000.0, bar_unfinished=False, bar_s_per_it=None,
                    stuck_stats_lines=0, phase="weights_loading", phase_started_at=0.0,
                    expected_phase_s={"weights_loading": 1000.0})
    assert s.reason == "phase_overdue"


def test_live_failure_is_only_suspected_for_a_short_grace():
    st = LogState()
    st.feed_line("OSError: [Errno 28] No space left on device", 1, now=50.0)
    early = st.snapshot(now=55.0, alive=True)
    assert early["state"] == "running" and early["failure"] is None and early["suspect"]["reason"] == "disk_full"
    late = st.snapshot(now=90.0, alive=True)
    assert late["state"] == "failed" and late["failure"]["reason"] == "disk_full"
