"""FrameSplitter: bytes in, lines and \\r-frames out, bounded, whatever the chunking."""

from __future__ import annotations

from eaglelab.host.tail.frames import FrameSplitter


class Sink:
    def __init__(self, **kw):
        self.lines: list[tuple[str, int]] = []
        self.frames: list[tuple[str, int]] = []
        self.sp = FrameSplitter(lambda t, n: self.lines.append((t, n)), lambda t, n: self.frames.append((t, n)), **kw)


def run(chunks, **kw) -> Sink:
    s = Sink(**kw)
    for c in chunks:
        s.sp.feed(c)
    return s


def test_lines_frames_and_visible_text():
    s = run([b"start\n\rbar 1%\rbar 2%\rbar 3%\ndone\r\n"])
    assert s.lines == [("start", 1), ("bar 3%", 2), ("done", 3)]
    assert s.frames == [("bar 1%", 2), ("bar 2%", 2)]
    assert s.sp.lines == 3


def test_partial_last_line_waits_for_its_end_then_flush():
    s = run([b"one\ntw"])
    assert s.lines == [("one", 1)]
    s.sp.feed(b"o\nthr")
    assert s.lines == [("one", 1), ("two", 2)]
    s.sp.flush()
    assert s.lines[-1] == ("thr", 3) and s.sp.lines == 3


def test_any_chunking_gives_the_same_lines():
    data = b"a\r\nbar 1%\rbar 2%\rbar 3%\nx\xc3\xa9y\n\r\rz\n"
    whole = run([data])
    bytewise = run([data[i:i + 1] for i in range(len(data))])
    assert bytewise.lines == whole.lines
    assert [t for t, _ in bytewise.frames] == [t for t, _ in whole.frames]


def test_invalid_utf8_is_replaced_and_counted():
    s = run([b"ok\n\xff\xfebad\n"])
    assert s.lines[1] == ("\ufffd\ufffdbad", 2)
    assert s.sp.bad == 1


def test_overlong_line_is_cut_and_memory_stays_bounded():
    s = run([b"x" * 50 + b"\n"], max_line=16)
    assert s.lines == [("x" * 16, 1)] and s.sp.bad == 1
    # A line that never ends within one read: its head is handed over, the rest skipped, not kept.
    t = Sink(max_line=16)
    for _ in range(1000):
        t.sp.feed(b"y" * 1000)
        assert len(t.sp._partial) <= 16
    t.sp.feed(b"tail\nnext\n")
    assert t.frames[0] == ("y" * 16, 1)
    assert t.lines == [("", 1), ("next", 2)]
    assert t.sp.lines == 2 and t.sp.bad == 1


def test_long_frame_runs_are_sampled_by_stream_bytes_whatever_the_chunking():
    frames = b"".join(b"\rbar %04d" % i for i in range(2400))               # 21.6 kB of frames
    whole = run([frames + b"\n"], sample_bytes=1000)
    got = [t for t, _ in whole.frames]
    assert got[0] == "bar 0000" and 20 <= len(got) <= 24 and got == sorted(got)
    assert whole.lines == [("bar 2399", 1)]                                  # the last frame shows
    chunked = run([frames[i:i + 6000] for i in range(0, len(frames), 6000)] + [b"\n"], sample_bytes=1000)
    # Big reads are sampled alike; a read that brings a short run (here the last 3.6 kB) is taken whole.
    ch = [t for t, _ in chunked.frames]
    assert ch == sorted(ch) and ch[:18] == got[:18] and chunked.lines == [("bar 2399", 1)]
    live = run([frames[i:i + 300] for i in range(0, len(frames), 300)] + [b"\n"], sample_bytes=1000)
    assert len(live.frames) == 2399  # small reads (live tailing): every frame
    every = run([frames + b"\n"], sample_bytes=0)
    assert [t for t, _ in every.frames] == [f"bar {i:04d}" for i in range(2399)]
    small = run([b"\rbar 1\rbar 2\rbar 3\r", b"x"], sample_bytes=1000)
    assert [t for t, _ in small.frames] == ["bar 1", "bar 2", "bar 3"]


def test_a_bar_cleared_at_its_end_shows_its_last_frame_even_when_its_run_is_sampled():
    # tqdm(leave=False) ends its bar with `\r` + spaces + `\r`: the line's visible text is blank, and
    # a bulk read samples the run, so without care the bar's last count (here 2399) is never seen
    frames = b"".join(b"\rbar %04d" % i for i in range(2400))
    for clear in (b"\r" + b" " * 80 + b"\r\n", b"\r" + b" " * 80 + b"\n", b"\r\r\n"):
        s = run([frames + clear + b"next\n"], sample_bytes=1000)
        assert s.lines == [("bar 2399", 1), ("next", 2)], clear
    assert run([b"\rbar 1\r   \n"]).lines == [("bar 1", 1)]
    assert run([b"  \r\n"]).lines == [("  ", 1)]  # nothing before the blank: the blank shows


def test_reset_forgets_the_partial_line():
    s = run([b"abc\npartial"])
    s.sp.reset()
    s.sp.feed(b"fresh\n")
    assert s.lines == [("abc", 1), ("fresh", 2)]


def test_live_the_newest_frame_is_handed_over_before_its_terminator_comes():
    prov: list[str] = []
    s = Sink(on_provisional=lambda t, n: prov.append(t))
    s.sp.feed(b"\rLoading:  10%|# | 1/10 [00:30<04:30, 30.00s/it]")
    assert prov == ["Loading:  10%|# | 1/10 [00:30<04:30, 30.00s/it]"]  # not held back for 30 s
    assert s.frames == []
    s.sp.feed(b"\rLoading:  20%|## | 2/10 [01:00<04:00, 30.00s/it]  ")
    s.sp.feed(b"\n")
    assert prov[-1] == "Loading:  20%|## | 2/10 [01:00<04:00, 30.00s/it]"
    assert [t for t, _ in s.frames] == ["Loading:  10%|# | 1/10 [00:30<04:30, 30.00s/it]"]
    assert s.lines == [("Loading:  20%|## | 2/10 [01:00<04:00, 30.00s/it]  ", 1)]  # delivered as usual too
    s.sp.feed(b"OSError: [Errno 28]")
    assert len(prov) == 2  # only what ends like a tqdm frame is handed over early


def test_bar_frames_sharing_lines_with_log_records_each_count():
    # tqdm writes `\r` + frame, a logger then writes its record and `\n` on the same line, the next
    # frame comes later: every frame is an observation of the bar, every record is read.
    from eaglelab.host.tail.whole import parse_bytes

    log = "".join(f"\rTraining:  {k}%|#| {k}/64 [00:{10 + 2 * k:02d}<00:30,  2.00s/it, loss=1.0]"
                  f"2026-07-07 22:20:{k:02d} | INFO | __main__ | epoch=0 step={k} loss={k}.5\n" for k in range(1, 9))
    s = parse_bytes(log.encode(), include_history=True)
    bar = s["progress_bars"][0]
    assert bar["observations"] == 8 and [n for _, n in bar["history"]] == list(range(1, 9))
    assert [v for _, v in s["metrics"]["loss"]] == [k + 0.5 for k in range(1, 9)]
