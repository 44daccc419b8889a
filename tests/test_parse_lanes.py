"""Concurrent bars of one key (the same label and total from several processes, in one stream with
no prefix) are told apart as lanes by the continuity of their count and clock, not read as one bar
restarting at every switch (eaglelab.host.parse.bars)."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from eaglelab.eta.replay import replay
from eaglelab.host.parse.bars import MAX_LANES, BarBook
from eaglelab.host.parse.progress import parse_bar
from eaglelab.host.parse.state import LogState
from eaglelab.host.tail.frames import FrameSplitter

ROOT = Path(__file__).resolve().parents[1]
FRAUDR1 = ROOT / "bench" / "corpus" / "public" / "fraudr1-3-concurrent-eval-bars-1175.log"


def frame(n: int, total: int, elapsed: float, s_per_it: float | None = None, desc: str = "") -> str:
    """One frame as tqdm draws it."""
    rate = None if s_per_it is None else 1.0 / s_per_it
    return tqdm.format_meter(n, total, elapsed, prefix=desc, rate=rate)


def read(text: str) -> LogState:
    state = LogState()
    splitter = FrameSplitter(state.feed_line, state.feed_frame, sample_bytes=0)  # every frame
    splitter.feed(text.encode())
    splitter.flush()
    state.end_of_log()
    return state


def interleaved(rates: list[float], total: int, desc: str = "eval") -> str:
    """Bars at the given s/item, started together, each frame written when its item is done."""
    events = sorted((i * r, k, i) for k, r in enumerate(rates) for i in range(total + 1))
    return "\r".join(frame(i, total, int(t), rates[k] if i else None, desc) for t, k, i in events) + "\n"


def test_fraudr1_three_concurrent_eval_bars_are_three_lanes():
    state = read(FRAUDR1.read_text(errors="replace"))
    tracks = list(state.bars.bars.values())
    assert sorted(t.lane for t in tracks) == [0, 1, 2]
    assert sorted(t.label for t in tracks) == ["", "[lane 2]", "[lane 3]"]
    for t in tracks:
        assert t.restarts == 0  # no fake restart at the switches
        ns = [h[0] for h in t.history]
        clock = [h[2] for h in t.history]
        assert ns == sorted(ns) and clock == sorted(clock)
        assert t.latest.n == 1175 and t.finished  # the log gets every worker to the end
        assert t.observations > 1000  # each lane holds its own worker's frames


def test_two_interleaved_bars_at_different_rates_each_get_their_own_eta():
    total, rates = 400, [1.0, 1.7]
    rows = list(replay(interleaved(rates, total).split("\n")))
    keys = list(dict.fromkeys(r.key for r in rows))
    assert keys == [("", "eval", 0), ("", "eval [lane 2]", 0)]
    assert {r.instance for r in rows} == {0}
    lanes = {}
    for k, rate in zip(keys, rates):
        mine = [r for r in rows if r.key == k]
        mid = next(r for r in mine if r.n >= total // 2)
        truth = (total - mid.n) * rate
        assert abs(mid.eta_s - truth) < 0.1 * truth, (k, mid.eta_s, truth)
        lanes[k] = mine
    # which lane is which follows the rate it goes at
    assert lanes[keys[0]][-1].elapsed_s < lanes[keys[1]][-1].elapsed_s


def test_headline_follows_the_slowest_live_lane():
    text = interleaved([1.0, 2.0], 100)
    cut = text.split("\r")
    state = read("\r".join(cut[: len(cut) * 2 // 3]) + "\n")
    progress = state.snapshot()["progress"]
    bars = {b["label"]: b for b in state.snapshot()["progress_bars"]}
    assert set(bars) == {"eval", "eval [lane 2]"}
    assert progress["label"] == "eval [lane 2]" and progress["n"] == bars["eval [lane 2]"]["n"] < bars["eval"]["n"]


def test_an_epoch_starting_over_at_zero_is_still_a_restart():
    epoch = [frame(i, 50, i * 0.5, 0.5 if i else None, "train") for i in range(51)]
    state = read("\r".join(epoch) + "\n" + "\r".join(epoch) + "\n")
    (track,) = state.bars.bars.values()
    assert track.lane == 0 and track.restarts == 1 and track.prior_s_per_item == 0.5
    assert len(track.history) == 51


def test_a_single_bar_and_its_redraws_are_as_before():
    book = BarBook()
    first = parse_bar(frame(3, 10, 3.0, 1.0, "load"))
    track, advanced = book.observe(first, 1, None)
    assert advanced and track.key == ("", "load", 0) and book.current is track
    again, advanced = book.observe(parse_bar(frame(3, 10, 3.0, 1.0, "load")), 1, None)
    assert again is track and not advanced and track.observations == 1
    later, advanced = book.observe(parse_bar(frame(5, 10, 5.0, 1.0, "load")), 1, None)
    assert later is track and advanced and len(book.bars) == 1


def test_a_garbled_stream_cannot_open_more_lanes_than_the_cap():
    # every frame goes back in count and clock, part way, with time on its clock: each looks like
    # one more concurrent bar
    frames = [frame(5000 - 7 * i, 10000, 5000 - 7 * i, 1.0, "x") for i in range(300)]
    state = read("\r".join(frames) + "\n")
    assert len(state.bars.bars) == MAX_LANES
    assert sum(t.restarts for t in state.bars.bars.values()) == 300 - MAX_LANES


def staggered(starts: list[float], rates: list[float], total: int, desc: str = "extract") -> str:
    """Bars that start at different moments (a GPU's job joining late), each frame written when its
    item is done, its clock its own."""
    events = sorted((s + i * r, k, i) for k, (s, r) in enumerate(zip(starts, rates)) for i in range(total + 1))
    return "\r".join(frame(i, total, int(t - starts[k]), rates[k] if i else None, desc) for t, k, i in events) + "\n"


def test_a_worker_joining_late_is_a_lane_of_its_own_not_a_restart():
    # the second worker's 0/100 [00:00] comes while the first is 7 s in: read as a restart until
    # the first draws again, then both are put right
    state = read(staggered([0.0, 7.0], [1.0, 1.3], 100))
    tracks = sorted(state.bars.bars.values(), key=lambda t: t.lane)
    assert [t.label for t in tracks] == ["extract", "extract [lane 2]"]
    for t, rate in zip(tracks, [1.0, 1.3]):
        assert t.restarts == 0 and t.prior_s_per_item is None and t.prior_run is None  # no fake prior run
        ns, clock = [h[0] for h in t.history], [h[2] for h in t.history]
        assert ns == list(range(101))  # every one of its frames, none of the other's
        assert clock == sorted(clock) and abs(clock[-1] / 100 - rate) < 0.02
        assert t.observations == 101


def test_a_rerun_after_the_first_run_stopped_is_still_a_restart():
    # the first run dies at 50/100; the rerun starts from 0 and passes where the first stopped
    first = [frame(i, 100, i, 1.0 if i else None, "extract") for i in range(51)]
    rerun = [frame(i, 100, int(i * 1.3), 1.3 if i else None, "extract") for i in range(101)]
    state = read("\r".join(first + rerun) + "\n")
    (track,) = state.bars.bars.values()
    assert track.restarts == 1 and track.prior_s_per_item == 1.0 and track.latest.n == 100
    assert [h[0] for h in track.history] == list(range(101))


def test_a_bar_cut_short_again_and_again_keeps_one_replaced_run_at_most():
    # an evaluation bar left part way and started over many times: the run each restart replaced is
    # kept for a few frames, never a chain of every earlier run (memory stays bounded)
    runs = [frame(i, 100, i, 1.0 if i else None, "eval") for _ in range(50) for i in range(3)]
    state = read("\r".join(runs) + "\n")
    (track,) = state.bars.bars.values()
    assert track.restarts == 49
    assert track.replaced is None or track.replaced.replaced is None
