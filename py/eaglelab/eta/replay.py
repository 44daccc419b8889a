"""Replay a log's progress lines through the bar estimator, as if the log were being tailed live.

Pure (text in, rows out): `lab eta replay` and bench/bench_eta.py share it. Every row is computed
only from the frames up to its own, with the bar's own printed elapsed time as the clock (a line's
timestamp where the frame has no elapsed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

from .estimator import BarTracker, TqdmEma
from eaglelab.figures import seconds
from eaglelab.fsutil import parse_iso
from eaglelab.host.parse.prefixes import split_prefix
from eaglelab.host.parse.progress import parse_progress_glued

# Timestamps that start a log line (after a docker timestamp, which split_prefix finds):
# `2026-03-13 13:32:28[,.]123`, `[2026-03-13 13:32:28]`, ISO with T.
_TS_RE = re.compile(r"^\[?(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?")
_DIGITS = re.compile(r"\d+(?:\.\d+)?")


@dataclass
class ReplayRow:
    line: int  # 1-based line of the file the frame is on
    key: tuple[str, str]  # (process prefix, label with its numbers blanked): one bar
    instance: int  # how many times this key's bar restarted before (a new epoch, a rerun)
    label: str
    n: float
    total: float | None
    elapsed_s: float | None  # the bar's clock: its printed elapsed, or seconds since its first frame
    eta_s: float | None
    eta_low_s: float | None
    eta_high_s: float | None
    tqdm_eta_s: float | None  # what the frame itself printed as remaining
    ema_eta_s: float | None  # tqdm's EMA (smoothing 0.3) replayed over the frames: the baseline
    rate_s_per_it: float | None = None  # the rate the frame printed
    elapsed_clock: bool = True  # the clock is the bar's own elapsed (it started at 0 with n=0)
    resolution: float = 1.0  # of the clock

    def public(self) -> dict:
        """The fields `lab eta replay --json` prints (docs/interfaces.md, "## ETA")."""
        r = seconds
        return {"label": self.label, "n": self.n, "total": self.total, "elapsed_s": r(self.elapsed_s),
                "eta_s": r(self.eta_s), "eta_low_s": r(self.eta_low_s), "eta_high_s": r(self.eta_high_s),
                "tqdm_eta_s": r(self.tqdm_eta_s)}


def frames(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(line number, frame) for every `\\r`-separated frame of every line."""
    for i, line in enumerate(lines, 1):
        for frame in line.rstrip("\n").split("\r"):
            if frame.strip():
                yield i, frame


def line_timestamp(frame: str) -> tuple[float, float] | None:
    """(epoch seconds, resolution) of the timestamp a line starts with, or None."""
    split = split_prefix(frame)
    if split.timestamp:
        return parse_iso(split.timestamp), 1e-3
    m = _TS_RE.match(split.message.lstrip())
    if m is None:
        return None
    day, hms, frac = m.groups()
    ts = parse_iso(f"{day}T{hms}{'.' + frac if frac else ''}+00:00")
    return ts, (10.0 ** -len(frac)) if frac else 1.0


class _Bar:
    def __init__(self, use_elapsed: bool, resolution: float, label: str = ""):
        self.tracker = BarTracker(resolution=resolution, label=label)
        self.ema: TqdmEma | None = None
        self.use_elapsed = use_elapsed
        self.first_clock: float | None = None
        self.total: float | None = None
        self.instance = 0


def replay(lines: Iterable[str], horizons: dict[tuple[tuple[str, str], int], float] | None = None) -> Iterator[ReplayRow]:
    """One row per progress frame, in file order, each estimated from the frames up to it.

    horizons: {(key, instance): count} estimates the time to reach that count instead of the bar's
    total (the benchmark scores an excerpt that stops mid-bar up to its last count); tqdm's printed
    remaining time is scaled to it (tqdm's is items left / its rate)."""
    bars: dict[tuple[str, str], _Bar] = {}
    last_ts: tuple[float, float] | None = None
    for lineno, frame in frames(lines):
        ts = line_timestamp(frame)
        if ts is not None and ts[0] is not None:
            last_ts = ts
        p = parse_progress_glued(frame)
        if p is None:
            continue
        key = (p.prefix, _DIGITS.sub("#", p.label))
        use_elapsed = p.elapsed_s is not None
        clock_ts = ts or last_ts
        bar = bars.get(key)
        restarted = bar is not None and (
            p.total != bar.total or use_elapsed != bar.use_elapsed
            or (bar.tracker.points and p.n < bar.tracker.points[-1][1]))
        if bar is None or restarted:
            res = 1.0 if use_elapsed else (clock_ts[1] if clock_ts else 1.0)
            new = _Bar(use_elapsed, res, p.label)
            new.instance = bar.instance + 1 if bar is not None else 0
            bar = bars[key] = new
            bar.total = p.total
        if use_elapsed:
            clock = p.elapsed_s
            if bar.ema is None:
                bar.ema = TqdmEma(start=(0.0, 0))
        elif clock_ts is not None:
            bar.first_clock = clock_ts[0] if bar.first_clock is None else bar.first_clock
            clock = clock_ts[0] - bar.first_clock
            if bar.ema is None:
                bar.ema = TqdmEma()
        else:
            clock = None
        total, tqdm_left = p.total, p.remaining_s
        if horizons and (key, bar.instance) in horizons:
            total = horizons[(key, bar.instance)]
            if tqdm_left is not None:
                tqdm_left = (tqdm_left * max(total - p.n, 0.0) / (p.total - p.n)
                             if p.total is not None and p.total > p.n else None)
        est = None
        if clock is not None and use_elapsed:
            bar.tracker.add_elapsed(clock, p.n, total, p.rate_s_per_it)
        elif clock is not None:
            bar.tracker.add(clock, p.n, total, p.rate_s_per_it)
        if clock is not None:
            bar.ema.update(clock, p.n)
            est = bar.tracker.estimate()
        ema_eta = bar.ema.eta(total, p.n) if bar.ema is not None and clock is not None else None
        eta = low = high = None
        if est is not None:
            eta, low, high = est.eta_s, est.eta_low_s, est.eta_high_s
        elif tqdm_left is not None:  # nothing to fit and no rate: tqdm's number, a wide range
            eta, low, high = tqdm_left, tqdm_left * 0.5, tqdm_left * 2.0
        yield ReplayRow(line=lineno, key=key, instance=bar.instance, label=p.label, n=p.n, total=total,
                        elapsed_s=clock, eta_s=eta, eta_low_s=low, eta_high_s=high,
                        tqdm_eta_s=tqdm_left, ema_eta_s=ema_eta, rate_s_per_it=p.rate_s_per_it,
                        elapsed_clock=use_elapsed, resolution=bar.tracker.resolution)
