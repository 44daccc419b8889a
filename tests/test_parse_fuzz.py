"""Property-based fuzzing of the whole parser: no input crashes it, and chunking never matters."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.host.parse.progress import parse_progress
from eaglelab.host.parse.state import LogState
from eaglelab.host.tail.frames import FrameSplitter
from eaglelab.host.tail.whole import parse_chunks

# Pieces of real log lines, so that random mixes reach deep into the recognizers.
PIECES = [
    b"Loading safetensors checkpoint shards:  86% Completed | 55/64 [20:02<04:10, 27.81s/it]",
    b"(Worker_TP0 pid=12) ", b"[rank3]:", b"0: ", b"2026-01-02T03:04:05.1Z ", b"\x1b[0;36m", b"[0;36m",
    b"INFO 05-06 20:59:57 [x.py:1] ", b"ERROR 05-06 20:59:57 [x.py:1] ", b"WARNING:root:",
    b"Traceback (most recent call last):", b'  File "x.py", line 1', b"OSError: [Errno 28] No space left on device",
    b"torch.OutOfMemoryError: CUDA out of memory", b"Killed", b"exitcode  : -9", b"ValueError: x",
    b"train/loss=1.000, global_step=3", b"Training epoch 1/2 started", b"Application startup complete.",
    b"eaglelab: phase x started", b"eaglelab: failed disk_full: y", b"eaglelab: done",
    b"Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 3 reqs",
    b" 45%|####5     | 45/100 [1 day, 0:00:01<?, ?it/s, loss=0.1]", b"[00:01<00:02, 1.5it/s]", b"]", b"[", b"%|",
    b"\r", b"\n", b"\r\n", b"\xff", b"\xc3", b"\xe2\x96\x88", b"\x00", b" " * 40,
]
chunks = st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=64)), max_size=60)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks)
def test_any_bytes_parse_to_valid_state_json(parts):
    state = parse_chunks(parts)
    json.dumps(state)  # serialisable
    assert state["schema"] == 1
    assert state["state"] in ("running", "completed", "failed", "stalled")
    data = b"".join(parts)
    # Every newline ends a line; at EOF the unterminated rest counts as one more.
    assert state["lines"] == data.count(b"\n") + (1 if data.rsplit(b"\n", 1)[-1] else 0)
    assert state["bad_lines"] >= 0
    if state["failure"] is not None:
        assert state["failure"]["reason"] in ("cuda_oom", "host_oom_killed", "nccl_error", "disk_full",
                                              "import_error", "timeout", "python_exception", "other",
                                              "cuda_error", "cuda_assert", "time_limit", "segfault", "signal",
                                              "killed", "lost")


@settings(max_examples=200, deadline=None)
@given(chunks, st.integers(min_value=1, max_value=17))
def test_chunk_boundaries_do_not_change_what_is_seen(parts, size):
    data = b"".join(parts)
    whole = parse_chunks([data])
    pieces = parse_chunks([data[i:i + size] for i in range(0, len(data), size)])
    for key in ("state", "failure", "lines", "metrics", "phases", "ready"):
        assert pieces[key] == whole[key], key


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.integers(min_value=1, max_value=5))
def test_huge_lines_stay_bounded(seed, factor):
    line = (seed or b"x") * (20000 * factor)
    seen: list[str] = []
    sp = FrameSplitter(lambda t, n: seen.append(t), lambda t, n: seen.append(t), max_line=4096)
    for i in range(0, len(line), 65536):
        sp.feed(line[i:i + 65536])
        assert len(sp._partial) <= 4096
    sp.feed(b"\n")
    assert all(len(t.encode("utf-8", "surrogatepass")) <= 3 * 4096 for t in seen)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parse_progress_never_raises(text):
    p = parse_progress(text)
    if p is not None:
        assert p.n >= 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=120), max_size=40))
def test_state_machine_takes_any_text_lines(lines):
    s = LogState()
    for i, line in enumerate(lines, 1):
        s.feed_line(line, i, now=float(i))
    snap = s.snapshot(now=1e6, alive=True)
    json.dumps(snap)
    assert s.bad_lines == 0  # no recognizer raised (a raise is caught and counted, so count it here)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([p.decode("utf-8", "replace") for p in PIECES]) | st.text(max_size=30), max_size=12))
def test_mixes_of_real_pieces_never_make_a_recognizer_raise(pieces):
    s = LogState()
    s.feed_line("".join(pieces), 1, now=1.0)
    s.feed_frame("".join(reversed(pieces)), 1, now=2.0)
    assert s.bad_lines == 0


@settings(max_examples=100, deadline=None)
@given(chunks, st.integers(min_value=1, max_value=64))
def test_reading_a_file_through_one_buffer_equals_feeding_chunks(parts, chunk):
    import tempfile

    from eaglelab.host.tail.whole import parse_file

    data = b"".join(parts)
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        from_file = parse_file(f.name, chunk=chunk)
    from_chunks = parse_chunks([data])
    for key in ("state", "failure", "lines", "bad_lines", "metrics", "phases", "ready", "progress"):
        assert from_file[key] == from_chunks[key], key
