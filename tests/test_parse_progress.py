"""parse_progress on real tqdm output (rendered by tqdm itself) and on lines from real logs."""

from __future__ import annotations

import io

import pytest
from tqdm import tqdm

from eaglelab.host.parse.progress import parse_progress, parse_time
from eaglelab.host.tail.whole import parse_bytes


def frames_of(**kw) -> list[str]:
    """Every frame a real tqdm bar writes to a file, split on \\r and \\n as the tailer does."""
    buf = io.StringIO()
    total = kw.pop("total", 7)
    steps = kw.pop("steps", total or 5)
    postfix = kw.pop("postfix", None)
    inc = kw.pop("inc", 1)
    with tqdm(total=total, file=buf, mininterval=0, miniters=1, **kw) as bar:
        for _ in range(steps):
            if postfix:
                bar.set_postfix(postfix)
            bar.update(inc)
    return [f for f in buf.getvalue().replace("\n", "\r").split("\r") if f.strip()]


@pytest.mark.parametrize("kw", [
    dict(desc="Generating responses", postfix={"ok": 3, "err": 0}),
    dict(desc="Loading", ascii=True),
    dict(total=None, steps=4, desc="no total"),
    dict(desc="bytes", unit="B", unit_scale=True, total=5_000_000, steps=5, inc=1_000_000),
    dict(),
    dict(desc="Loading safetensors checkpoint shards",
         bar_format="{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]"),
])
def test_every_real_tqdm_frame_parses_with_its_count(kw):
    desc = kw.get("desc", "")
    frames = frames_of(**kw)
    assert len(frames) >= 3
    ns = []
    for frame in frames:
        p = parse_progress(frame)
        assert p is not None, frame
        assert p.label == desc
        ns.append(p.n)
    assert ns == sorted(ns) and ns[0] == 0  # counts as tqdm printed them, in order
    last = parse_progress(frames[-1])
    if kw.get("total", 7) is not None:
        assert last.total is not None and last.n == last.total and last.percent == 100.0


def test_postfix_dict_from_real_tqdm():
    p = parse_progress(frames_of(desc="x", postfix={"ok": 3, "rps": "1.5"})[-1])
    assert p.postfix == {"ok": "3", "rps": "1.5"}


def test_vllm_weights_loading_line():
    p = parse_progress("Loading safetensors checkpoint shards:  86% Completed | 55/64 [20:02<04:10, 27.81s/it]")
    assert (p.label, p.n, p.total, p.percent) == ("Loading safetensors checkpoint shards", 55, 64, 86.0)
    assert (p.elapsed_s, p.remaining_s, p.rate, p.rate_unit, p.rate_s_per_it) == (1202.0, 250.0, 27.81, "s/it", 27.81)


def test_prefix_and_pasted_colour_remnants():
    line = ("[1;36m(EngineCore_DP0 pid=3120)[0;0m Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
            "100%|██████████| 67/67 [00:03<00:00, 20.12it/s]")
    p = parse_progress(line)
    assert p.prefix == "(EngineCore_DP0 pid=3120)"
    assert p.label == "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    assert p.n == p.total == 67
    assert p.rate_s_per_it == pytest.approx(1 / 20.12)


def test_real_escape_bytes_and_stacked_prefixes():
    line = "2026-01-02T03:04:05.123456789Z [rank3]: (Worker_TP1 pid=77) \x1b[32mTrain\x1b[0m:  10%|█  | 1/10 [00:01<?, ?it/s]"
    p = parse_progress(line)
    assert p.prefix == "[rank3]: (Worker_TP1 pid=77)"
    assert (p.label, p.n, p.total, p.remaining_s, p.rate, p.rate_s_per_it) == ("Train", 1, 10, None, None, None)


def test_hf_notebook_style_without_bar():
    p = parse_progress("57% 4/7 [00:02<00:01, 1.50it/s]")
    assert (p.label, p.n, p.total, p.percent, p.rate_unit) == ("", 4, 7, 57.0, "it/s")


def test_long_times_and_colon_postfix():
    p = parse_progress("Epoch 0: 50%|#####     | 5/10 [1 day, 2:03:04<1:00:00, 1.50s/it, loss: 0.25, lr=1e-05]")
    assert p.elapsed_s == 86400 + 2 * 3600 + 3 * 60 + 4
    assert p.remaining_s == 3600.0
    assert p.postfix == {"loss": "0.25", "lr": "1e-05"}


def test_vllm_processed_prompts_postfix_with_colons():
    p = parse_progress("Processed prompts: 100%|██████████| 10/10 [00:01<00:00,  6.50it/s, "
                       "est. speed input: 123.45 toks/s, output: 456.78 toks/s]")
    assert p.postfix == {"est. speed input": "123.45 toks/s", "output": "456.78 toks/s"}
    assert p.rate == 6.5


def test_unit_scaled_bytes():
    p = parse_progress("model.safetensors:  45%|####5     | 2.25G/4.98G [00:30<00:36, 75.3MB/s]")
    assert (p.n, p.total, p.unit, p.rate_unit) == (2_250_000_000, 4_980_000_000, "B", "B/s")


@pytest.mark.parametrize("line", [
    "INFO 05-01 10:00:00 [loader.py:12] Loading weights took 12.3 seconds",
    "train/loss=1.234, train/full_acc_0=0.5, epoch=0, global_step=10",
    "[rank0]: Traceback (most recent call last):",
    "values [1, 2, 3]",
    "",
    "[12:01:02] INFO     Training epoch 1/3 started            train.py:120",
])
def test_non_bars_are_none(line):
    assert parse_progress(line) is None


def test_parse_time_forms():
    assert parse_time("04:10") == 250.0
    assert parse_time("1:00:01") == 3601.0
    assert parse_time("2 days, 0:00:01") == 2 * 86400 + 1.0
    assert parse_time("?") is None and parse_time(None) is None


def test_rate_flipping_between_s_per_it_and_it_per_s_is_normalised():
    slow = parse_progress("Loading: 10%|#  | 1/10 [00:02<00:18,  2.00s/it]")
    fast = parse_progress("Loading: 20%|## | 2/10 [00:02<00:08,  1.25it/s]")
    assert (slow.rate_unit, slow.rate_s_per_it) == ("s/it", 2.0)
    assert (fast.rate_unit, fast.rate_s_per_it) == ("it/s", 0.8)
    assert slow.key == fast.key  # the same bar


def test_nested_bars_from_real_tqdm_are_kept_apart():
    from eaglelab.host.tail.whole import parse_bytes

    buf = io.StringIO()
    with tqdm(total=2, desc="Epoch", file=buf, mininterval=0, position=0) as outer:
        for _ in range(2):
            for _ in tqdm(range(3), desc="Batch", file=buf, mininterval=0, position=1, leave=False):
                pass
            outer.update(1)
    s = parse_bytes(buf.getvalue().encode(), include_history=True)
    bars = {b["label"]: b for b in s["progress_bars"]}
    assert bars["Epoch"]["n"] == 2 and bars["Epoch"]["total"] == 2
    assert bars["Batch"]["total"] == 3 and bars["Batch"]["restarts"] == 1  # the inner bar ran twice
    assert s["bad_lines"] == 0


def test_unlabelled_nested_bars_are_kept_apart_by_their_position():
    # HF Trainer's evaluation bar (position 1, leave=False, no desc) inside its training bar (no desc
    # either), written by real tqdm; a log record glued after an inner frame's cursor-up, as in a
    # DeepSpeed run's log (bench/corpus/public/hubert-llama-deepspeed-train-llama2-7b.log)
    from eaglelab.host.parse.progress import nested_position
    from eaglelab.host.tail.whole import parse_bytes

    buf = io.StringIO()
    with tqdm(total=6, file=buf, mininterval=0, position=0) as train:
        for step in range(6):
            train.update(1)
            if step % 3 == 2:
                for _ in tqdm(range(4), file=buf, mininterval=0, position=1, leave=False):
                    pass
                buf.write("03/07/2024 21:45:40 - INFO - __main__ - eval done\n")
    s = parse_bytes(buf.getvalue().encode(), include_history=True)
    bars = {(b["total"], b["restarts"]): b for b in s["progress_bars"]}
    assert sorted(bars) == [(4, 1), (6, 0)], bars  # the training bar never "restarts" at an evaluation
    assert bars[(6, 0)]["n"] == 6 and [n for _e, n in bars[(6, 0)]["history"]] == sorted(
        n for _e, n in bars[(6, 0)]["history"])
    # a nested bar that stays (leave=True, vLLM's `Processed prompts` under `Adding requests`): tqdm
    # draws its last frame on the first row; it is still that bar, and it ends
    buf = io.StringIO()
    with tqdm(total=2, file=buf, mininterval=0, position=0) as outer:
        for _ in tqdm(range(5), file=buf, mininterval=0, position=1, leave=True):
            pass
        outer.update(2)
    s = parse_bytes(buf.getvalue().encode(), include_history=True)
    assert sorted((b["n"], b["total"], b["restarts"]) for b in s["progress_bars"]) == [(2, 2, 0), (5, 5, 0)]
    assert nested_position("\r 50%|#####     | 2/4 [00:01<00:01,  2.00it/s]\x1b[A03/07/2024 INFO x") == 1
    assert nested_position("\r 50%|#####     | 2/4 [00:01<00:01,  2.00it/s]\x1b[A\x1b[A") == 2
    assert nested_position("\r 50%|#####     | 2/4 [00:01<00:01,  2.00it/s]") == 0


@pytest.mark.parametrize("line,prefix,message", [
    ("(Worker_TP0 pid=12) x", "(Worker_TP0 pid=12)", "x"),
    ("(Worker_PP0_TP0_EP0 pid=7) x", "(Worker_PP0_TP0_EP0 pid=7)", "x"),
    ("(VllmWorker rank=0 pid=34) x", "(VllmWorker rank=0 pid=34)", "x"),
    ("(RayWorkerWrapper pid=1234, ip=10.77.0.1) x", "(RayWorkerWrapper pid=1234, ip=10.77.0.1)", "x"),
    ("(pid=99) x", "(pid=99)", "x"),
    ("[rank3]: x", "[rank3]:", "x"),
    ("[rank0]:[W914 04:53:45.6 ProcessGroupNCCL.cpp:1476] w", "[rank0]:", "[W914 04:53:45.6 ProcessGroupNCCL.cpp:1476] w"),
    ("[default0]:x", "[default0]:", "x"),
    ("0: x", "0:", "x"),
    ("[1,0]<stdout>: x", "[1,0]<stdout>:", "x"),
    ("2026-05-12T08:01:39.331095044Z (APIServer pid=1) x", "(APIServer pid=1)", "x"),
    ("(EngineCore pid=1) (RayWorkerWrapper pid=2) x", "(EngineCore pid=1) (RayWorkerWrapper pid=2)", "x"),
    ("(not a prefix) x", "", "(not a prefix) x"),
    ("12:30:01 INFO x", "", "12:30:01 INFO x"),
])
def test_process_prefixes(line, prefix, message):
    from eaglelab.host.parse.prefixes import split_prefix

    s = split_prefix(line)
    assert (s.prefix, s.message) == (prefix, message)


def test_frames_written_out_by_cat_v_are_frames():
    # A README's output block pasted from `cat -v`: each carriage return is the two characters `^M`.
    frames = "".join(f"^MLoading checkpoint shards: {100 * n // 15:3d}%|#         | {n}/15 [00:{5 * n:02d}<00:30,  5.00s/it]"
                     for n in range(0, 16))
    p = parse_bytes(("CUDA SETUP: Loading binary\n" + frames + "\nTexts processed: 3\n").encode())["progress"]
    assert (p["label"], p["n"], p["total"], p["elapsed_s"]) == ("Loading checkpoint shards", 15, 15, 75.0)
    assert [n for _, n in p["history"]][-3:] == [13, 14, 15]  # every frame read, not only the last


def test_a_counter_frame_with_its_own_unit_and_a_log_line_glued_after_it_keeps_its_count():
    # `datasets`' counter (`908 examples [16:08, 17.25 examples/s]`, no total) with an NCCL watchdog
    # line glued after it, no newline (bench/corpus/public/alignhandbook-slurm-sft-shards-25m-nccl-watchdog-sigabrt.log):
    # the count stopped at the first frame of the line, and the failure's message carried the frame
    from eaglelab.host.tail.whole import parse_bytes

    frames = "".join(f"\rGenerating train split: {n} examples [15:{n // 100 + 3:02d}, {n / 60:.2f} examples/s]"
                     for n in range(4, 905, 150))
    watchdog = ("[rank2]:[E922 03:32:06.115905315 ProcessGroupNCCL.cpp:607] [Rank 2] Watchdog caught collective "
                "operation timeout: WorkNCCL(SeqNum=875, OpType=ALLREDUCE) ran for 1800031 milliseconds before timing out.")
    log = frames + "\rGenerating train split: 908 examples [16:08, 17.25 examples/s]" + watchdog + "\n"
    s = parse_bytes(log.encode())
    assert s["progress"]["label"] == "Generating train split"
    assert (s["progress"]["n"], s["progress"]["total"]) == (908, None)
    assert s["failure"]["reason"] == "nccl_error" and s["failure"]["message"] == watchdog
