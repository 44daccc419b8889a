"""Every progress bar seen in a log, kept apart by (process prefix, label, nested position), with its history.

The history — (n, total, elapsed_s, printed s/it) per observation — is what the ETA estimator
needs; elapsed_s is the bar's own printed elapsed time or, for a frame that prints none (`[?<?]`),
the seconds since the bar's first frame by the lines' own timestamps (`line_timestamp`). The tailer,
`lab parse` and `lab eta replay` all read bars through this book, so they estimate from the same
history (eaglelab.eta.bar_eta; the tailer and `lab parse` apply it, this package does not import it). It is
bounded: when a bar has MAX_HISTORY observations, every other one is dropped, so the history
still spans the whole bar at half the density and memory stays constant however long the run.

Bars of one key drawn by several processes into one stream (eight GPUs' jobs, evaluation workers)
are kept apart as lanes by the continuity of their count and clock (_route); a lane after the
first is a bar of its own, labelled `label [lane 2]` (docs/logs.md, "Concurrent bars of one key").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace

from eaglelab.fsutil import parse_iso

from .prefixes import split_prefix
from .progress import Progress

MAX_HISTORY = 2048
MAX_BARS = 256  # distinct bars kept; the oldest finished ones are forgotten first
MAX_LANES = 16  # concurrent bars of one key told apart; past it a frame restarts the closest (a garbled log stays bounded)
ALONGSIDE_S, ALONGSIDE_FRACTION = 30.0, 0.2  # how near in clock a frame opening a lane is to one (_alongside)
LIVE_FRAMES = 4  # a lane still draws while its last frame is within this many frames per lane of the newest

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
    lane: int = 0                        # which of the concurrent bars of one frame key (0: the first)
    seq: int = 0                         # the book's frame count at its last frame
    replaced: BarTrack | None = None     # the unfinished run a restart replaced, while it may still draw (_revive)

    @property
    def key(self) -> tuple[str, str, int]:
        """The frame's key; a lane after the first has its label (`label [lane 2]`) in it."""
        return (self.prefix, self.label, self.latest.position)

    @property
    def finished(self) -> bool:
        t = self.latest.total
        return t is not None and self.latest.n >= t


class BarBook:
    def __init__(self) -> None:
        self.bars: dict[tuple[str, str, int], BarTrack] = {}
        self.lanes: dict[tuple[str, str, int], list[BarTrack]] = {}  # a frame's key -> its concurrent bars
        self.current: BarTrack | None = None
        self.seq = 0  # frames observed: which lanes still draw

    def observe(self, p: Progress, line: int, now: float | None, line_ts: float | None = None,
                lead: bool = True) -> tuple[BarTrack, bool]:
        """Record p; returns its track and whether it moved on (n changed, or a new bar).

        line_ts: the line's own timestamp (epoch seconds), the bar's clock when it prints no elapsed.
        lead=False (a launcher rank other than 0): the bar is kept but becomes the current one only
        while no other is, so two ranks' interleaved bars cannot make the progress jump."""
        self.seq += 1
        lanes = self.lanes.get(p.key, [])
        if p.position == 0 and not any(t.latest.n <= p.n and t.latest.total == p.total for t in lanes):
            nested = self._closing_nested(p)
            if nested is not None:  # its last frame: tqdm's close(leave=True) draws it on the first row
                p.position = nested.latest.position
                lanes = self.lanes.get(p.key, [])
        if self._revive(p, lanes, line):
            lanes = self.lanes[p.key]
        track, how = _route(p, lanes, self.seq - LIVE_FRAMES * len(lanes))
        if track is None:
            track = self._new_lane(p, lanes, line, now)
            advanced = True
        else:
            prev = track.latest
            track.last_line = line
            track.seq = self.seq
            if how == _REDRAW:
                track.latest = p  # tqdm's duplicated final line, or a redraw: nothing new
                if lead or self.current is None:
                    self.current = self._headline(track, lanes)
                return track, False
            if how == _RESTART:
                # kept a while: another process's bar starting late reads as a restart until the
                # first one draws again (_revive)
                # (a bar with no total never finishes: its reruns are not told from late joiners)
                track.replaced = (replace(track, history=list(track.history), replaced=None)
                                  if track.latest.total is not None and not track.finished else None)
                _restart(track, line)
            advanced = p.n != prev.n or p.total != prev.total
            track.latest = p
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
            self.current = self._headline(track, lanes)
        return track, advanced

    def _new_lane(self, p: Progress, lanes: list[BarTrack], line: int, now: float | None) -> BarTrack:
        """A bar not seen before, or one more bar of a key already drawn by another process."""
        if len(self.bars) >= MAX_BARS:
            self._forget_one()
            lanes = self.lanes.get(p.key, [])
        used = {t.lane for t in lanes}
        lane = next(i for i in range(len(lanes) + 1) if i not in used)
        label = p.label if lane == 0 else f"{p.label} [lane {lane + 1}]".strip()  # its own key, readable
        track = BarTrack(label, p.prefix, p, line, line, now, lane=lane, seq=self.seq)
        self.bars[track.key] = track
        self.lanes.setdefault(p.key, []).append(track)
        return track

    def _revive(self, p: Progress, lanes: list[BarTrack], line: int) -> bool:
        """A restart that was another process joining late: the run the restart replaced draws again
        (p continues it, nearer than the new run) within a few frames, so both still go. The new run
        moves to a lane of its own, with no prior (the run before it was not its own), and the old
        one is put back as it was. True when lanes changed."""
        if len(lanes) >= MAX_LANES:
            return False
        live_from = self.seq - LIVE_FRAMES * (len(lanes) + 1)
        for t in lanes:
            old = t.replaced
            if old is None:
                continue
            if old.seq < live_from or t.finished:
                t.replaced = None  # it did not come back: a real restart
                continue
            # the old run moves on past where it was, and the new one has not caught up with it (a
            # rerun reaching the old run's count is the rerun)
            if (p.n <= old.latest.n or t.latest.n >= old.latest.n or not _continues(old.latest, p)
                    or (_continues(t.latest, p) and _gap(t, p) <= _gap(old, p))):
                continue
            joined = self._new_lane(t.latest, lanes, t.first_line, t.updated_at)
            for f in ("history", "first_ts", "last_line", "seq"):
                setattr(joined, f, getattr(t, f))
            joined.observations = len(t.history)  # its frames since the restart that was its start
            for f in fields(BarTrack):
                if f.name not in ("lane", "label"):
                    setattr(t, f.name, getattr(old, f.name))
            t.replaced = None
            return True
        return False

    def _headline(self, track: BarTrack, lanes: list[BarTrack]) -> BarTrack:
        """The bar the stage's progress shows for a frame of track: with several lanes of one key
        still drawing, the least advanced one (what the stage waits for), so the headline neither
        jumps between the processes' counts nor reads done while one of them still goes."""
        if len(lanes) < 2:
            return track
        live_from = self.seq - LIVE_FRAMES * len(lanes)
        live = [t for t in lanes if not t.finished and t.seq >= live_from]
        return min(live, key=lambda t: (_fraction(t.latest), t.lane)) if live else track

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
        gone = self.bars.pop(oldest)
        for base, lanes in list(self.lanes.items()):
            if gone in lanes:
                lanes.remove(gone)
                if not lanes:
                    del self.lanes[base]


# How a frame goes on from the lanes of its key (_route).
_REDRAW, _CONTINUE, _RESTART = "redraw", "continue", "restart"


def _continues(prev: Progress, p: Progress) -> bool:
    """p can be a later frame of the bar that drew prev: neither its count nor its clock went back."""
    return p.n >= prev.n and (p.elapsed_s is None or prev.elapsed_s is None or p.elapsed_s >= prev.elapsed_s)


def _gap(t: BarTrack, p: Progress) -> tuple:
    """How far p is from where t's bar would be by p's clock (its last count moved on at its printed
    rate): the nearest is the lane p goes on. Not the nearest clock first: bars that run together
    print the same second, and their counts are what tells them apart."""
    prev = t.latest
    de = p.elapsed_s - prev.elapsed_s if p.elapsed_s is not None and prev.elapsed_s is not None else 0.0
    ahead = de / prev.rate_s_per_it if prev.rate_s_per_it else 0.0
    return (p.total != prev.total, abs(p.n - prev.n - ahead), abs(de), t.lane)


def _starts_over(t: BarTrack, p: Progress) -> bool:
    """p, going back from t's last frame, is t's bar starting again (an epoch, a retry, a resume),
    not another process's bar: those started with it and run part way with time on their clock."""
    prev = t.latest
    if t.finished or p.n == 0 or p.elapsed_s is None or prev.elapsed_s is None:
        return True  # a finished bar draws no more; with no clock, today's rule: a step back restarts
    if p.elapsed_s == 0:
        return prev.elapsed_s > 0  # both in their first second: two bars starting together
    return p.elapsed_s <= 0.5 * prev.elapsed_s and p.n <= 0.5 * prev.n  # count and clock both far back


def _route(p: Progress, lanes: list[BarTrack], live_from: int) -> tuple[BarTrack | None, str]:
    """The lane p belongs to and how (a redraw, a later frame, a restart), or (None, '') for a new lane.
    live_from: a lane whose last frame is at or after this book frame count still draws."""
    if not lanes:
        return None, ""
    for t in lanes:  # tqdm's redraw (the same n and clock) is no news to the lane that drew it
        if p.n == t.latest.n and p.elapsed_s == t.latest.elapsed_s and p.total == t.latest.total:
            return t, _REDRAW
    going = [t for t in lanes if _continues(t.latest, p)]
    if going:
        return min(going, key=lambda t: _gap(t, p)), _CONTINUE
    restarting = [t for t in lanes if _starts_over(t, p)]
    if len(lanes) > 1:  # concurrent bars shown: one still drawing is another process's, p starts its own
        restarting = [t for t in restarting if t.finished or t.seq < live_from]
    if restarting or len(lanes) >= MAX_LANES or not any(_alongside(t, p) for t in lanes):
        return min(restarting or lanes, key=lambda t: _gap(t, p)), _RESTART
    return None, ""


def _alongside(t: BarTrack, p: Progress) -> bool:
    """p's clock is near t's last: bars that run together are drawn at about the same moments, so
    a frame far from every lane in time is a later run (a rerun seen part way), not another process."""
    prev = t.latest
    if p.elapsed_s is None or prev.elapsed_s is None:
        return False
    return abs(p.elapsed_s - prev.elapsed_s) <= max(ALONGSIDE_S, ALONGSIDE_FRACTION * prev.elapsed_s)


def _restart(track: BarTrack, line: int) -> None:
    """The same bar started over (next epoch, a retry): its run so far becomes the next one's prior."""
    if track.history:  # its mean rate is the next run's prior while that one is young
        n0, _t, e0, _r = track.history[-1]
        if e0 is not None and e0 > 0 and n0 and n0 > 0 and track.latest.elapsed_s is not None:
            track.prior_s_per_item = e0 / n0
        run = tuple((n, e) for n, _tot, e, _r in track.history if e is not None)
        track.prior_run = run if len(run) >= 2 else None
    track.history.clear()
    track.restarts += 1
    track.first_line = line
    track.first_ts = None


def _fraction(p: Progress) -> float:
    return p.n / p.total if p.total else float(p.n)


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
