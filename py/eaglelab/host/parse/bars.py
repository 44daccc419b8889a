"""Every progress bar seen in a log, kept apart by (process prefix, label, nested position), with its history.

The history — (n, total, elapsed_s, printed s/it) per observation — is what the ETA estimator
needs; elapsed_s is the bar's own printed elapsed time or, for a frame that prints none (`[?<?]`),
the seconds since the bar's first frame by the lines' own timestamps (`line_timestamp`). The tailer,
`lab parse` and `lab eta replay` all read bars through this book, so they estimate from the same
history (eaglelab.eta.bar_eta; the tailer and `lab parse` apply it, this package does not import it). It is
bounded: when a bar has MAX_HISTORY observations, every other one is dropped, so the history
still spans the whole bar at half the density and memory stays constant however long the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from eaglelab.fsutil import parse_iso

from .prefixes import split_prefix
from .progress import Progress

MAX_HISTORY = 2048
MAX_BARS = 256  # distinct bars kept; the oldest finished ones are forgotten first

Observation = tuple[float, float | None, float | None, float | None]  # (n, total, elapsed_s, s/it printed)


@dataclass(slots=True)
class BarTrack:
    label: str
    prefix: str
    latest: Progress
    first_line: int
    last_line: int
    updated_at: float | None            # clock time of the last observation (live tailing)
    history: list[Observation] = field(default_factory=list)
    observations: int = 0                # how many were seen (history may hold fewer)
    restarts: int = 0                    # times the bar started again from a lower n
    first_ts: float | None = None        # the line timestamp of its first frame (bars with no elapsed)
    prior_s_per_item: float | None = None  # its previous run's mean s/item (the epoch before): the history prior
    prior_run: tuple | None = None         # its previous run's (n, elapsed_s) points: the pace it went at, item by item

    @property
    def key(self) -> tuple[str, str, int]:
        return self.latest.key

    @property
    def finished(self) -> bool:
        t = self.latest.total
        return t is not None and self.latest.n >= t


class BarBook:
    def __init__(self) -> None:
        self.bars: dict[tuple[str, str, int], BarTrack] = {}
        self.current: BarTrack | None = None

    def observe(self, p: Progress, line: int, now: float | None, line_ts: float | None = None,
                lead: bool = True) -> tuple[BarTrack, bool]:
        """Record p; returns its track and whether it moved on (n changed, or a new bar).

        line_ts: the line's own timestamp (epoch seconds), the bar's clock when it prints no elapsed.
        lead=False (a launcher rank other than 0): the bar is kept but becomes the current one only
        while no other is, so two ranks' interleaved bars cannot make the progress jump."""
        key = p.key
        track = self.bars.get(key)
        if p.position == 0 and (track is None or p.n < track.latest.n or p.total != track.latest.total):
            nested = self._closing_nested(p)
            if nested is not None:  # its last frame: tqdm's close(leave=True) draws it on the first row
                p.position = nested.latest.position
                key, track = p.key, nested
        if track is None:
            if len(self.bars) >= MAX_BARS:
                self._forget_one()
            track = BarTrack(p.label, p.prefix, p, line, line, now)
            self.bars[key] = track
            advanced = True
        else:
            prev = track.latest
            if p.n == prev.n and p.elapsed_s == prev.elapsed_s and p.total == prev.total:
                track.latest = p  # tqdm's duplicated final line, or a redraw: nothing new
                track.last_line = line
                if lead or self.current is None:
                    self.current = track
                return track, False
            if p.n < prev.n or (p.elapsed_s is not None and prev.elapsed_s is not None and p.elapsed_s < prev.elapsed_s):
                if track.history:  # its mean rate is the next run's prior while that one is young
                    n0, _t, e0, _r = track.history[-1]
                    if e0 is not None and e0 > 0 and n0 and n0 > 0 and prev.elapsed_s is not None:
                        track.prior_s_per_item = e0 / n0
                    run = tuple((n, e) for n, _tot, e, _r in track.history if e is not None)
                    track.prior_run = run if len(run) >= 2 else None
                track.history.clear()  # the same bar started over (next epoch, a retry)
                track.restarts += 1
                track.first_line = line
                track.first_ts = None
            advanced = p.n != prev.n or p.total != prev.total
            track.latest = p
            track.last_line = line
        if advanced or now is not None:
            track.updated_at = now if advanced else track.updated_at
        track.observations += 1
        elapsed = p.elapsed_s
        if elapsed is None and line_ts is not None:
            if track.first_ts is None:
                track.first_ts = line_ts
            elapsed = line_ts - track.first_ts
        track.history.append((p.n, p.total, elapsed, p.rate_s_per_it))
        if len(track.history) > MAX_HISTORY:
            track.history = track.history[::2]
        if lead or self.current is None:
            self.current = track
        return track, advanced

    def _closing_nested(self, p: Progress) -> BarTrack | None:
        """The nested bar (same prefix, label and total) that a first-row frame at or past its count
        ends, if any: unfinished, or finished at this very count (the frame repeats its last)."""
        found = [t for t in self.bars.values()
                 if t.latest.position and t.prefix == p.prefix and t.label == p.label
                 and t.latest.total == p.total and (t.latest.n <= p.n if not t.finished else t.latest.n == p.n)
                 and (p.elapsed_s is None or t.latest.elapsed_s is None or t.latest.elapsed_s <= p.elapsed_s)]
        return max(found, key=lambda t: t.last_line) if found else None

    def _forget_one(self) -> None:
        victims = [k for k, t in self.bars.items() if t.finished and t is not self.current] or \
                  [k for k, t in self.bars.items() if t is not self.current]
        oldest = min(victims, key=lambda k: self.bars[k].last_line)
        del self.bars[oldest]


# Timestamps that start a log line (after a docker timestamp, which split_prefix finds):
# `2026-03-13 13:32:28[,.]123`, `[2026-03-13 13:32:28]`, ISO with T.
_TS_RE = re.compile(r"^\[?(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?")


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
