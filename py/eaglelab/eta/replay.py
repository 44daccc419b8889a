"""Replay a log's progress lines through the bar estimator, as if the log were being tailed live.

Pure (text in, rows out): `lab eta replay` and the benchmarks (bench/bench_eta.py,
bench/bench_holdout.py) share it. The lines go through the tailer's own reading (the frame
splitter, every frame, and the parser's state machine, eaglelab.host.parse.state.LogState), and
every row is the ETA the tailer's snapshot would show for that bar at that frame (estimator.bar_eta
on the parser's bar history): the benchmarks score what `lab status` and the page show. The clock
is the bar's own printed elapsed time (a line's timestamp where the frame prints none).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from eaglelab.figures import seconds
from eaglelab.host.parse.bars import line_timestamp  # noqa: F401  (re-exported: the bar clock)
from eaglelab.host.parse.state import LogState
from eaglelab.host.tail.frames import FrameSplitter

from .estimator import TqdmEma, bar_eta


@dataclass
class ReplayRow:
    line: int  # 1-based line of the file the frame is on
    key: tuple[str, str, int]  # (process prefix, label, nested position): one bar (the parser's bar book)
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
    prior_s_per_item: float | None = None  # the history prior the estimator was given
    lane: int = 0  # which of the concurrent bars of one key drawn into one stream (0: the first; its label reads `label [lane 2]` from 1)

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


def replay(lines: Iterable[str], horizons: dict[tuple[tuple[str, str, int], int], float] | None = None,
           priors: Callable[[str], float | None] | None = None, estimate: bool = True) -> Iterator[ReplayRow]:
    """One row per progress frame, in file order, each estimated from the frames up to it.

    horizons: {(key, instance): count} estimates the time to reach that count instead of the bar's
    total (the benchmark scores an excerpt that stops mid-bar up to its last count); tqdm's printed
    remaining time is scaled to it (tqdm's is items left / its rate).
    priors: label -> seconds per item from earlier runs (the history prior), used while a bar is
    too young to judge; a bar that starts over (the next epoch) takes its previous run's mean rate.
    estimate=False: the frames alone, no ETA (the rows' eta_* stay None): what the benchmarks read of a
    log to learn its counts and rates costs the parser's time, not the estimator's."""
    rows: list[ReplayRow] = []
    emas: dict[tuple, TqdmEma] = {}
    state = LogState(bar_eta=bar_eta)
    def on_bar(track, p) -> None:
        key, instance = track.key, track.restarts
        # the bar's previous run (the parser keeps it on the track, as the tailer sees it), else the caller's
        prior = track.prior_s_per_item or (priors(track.label) if priors else None)
        n, _tot, elapsed, _rate = track.history[-1] if track.history else (p.n, p.total, None, None)
        use_elapsed = p.elapsed_s is not None
        total, tqdm_left = p.total, p.remaining_s
        if horizons and (key, instance) in horizons:
            total = horizons[(key, instance)]
            if tqdm_left is not None:
                tqdm_left = (tqdm_left * max(total - p.n, 0.0) / (p.total - p.n)
                             if p.total is not None and p.total > p.n else None)
        eta = low = high = ema_eta = None
        if estimate and elapsed is not None:
            eta, low, high = bar_eta(track.history, total, track.label, tqdm_left, prior,
                                     prior_run=track.prior_run)
            ema = emas.get((key, instance))
            if ema is None:
                ema = emas[(key, instance)] = TqdmEma(start=(0.0, 0) if use_elapsed else None)
            ema.update(elapsed, p.n)
            ema_eta = ema.eta(total, p.n)
        elif estimate and tqdm_left is not None:  # nothing to fit and no clock: tqdm's number, a wide range
            eta, low, high = tqdm_left, tqdm_left * 0.5, tqdm_left * 2.0
        rows.append(ReplayRow(line=track.last_line, key=key, instance=instance, label=p.label, n=p.n,
                              total=total, elapsed_s=elapsed, eta_s=eta, eta_low_s=low, eta_high_s=high,
                              tqdm_eta_s=tqdm_left, ema_eta_s=ema_eta, rate_s_per_it=p.rate_s_per_it,
                              elapsed_clock=use_elapsed, resolution=1.0 if use_elapsed else 1e-3,
                              prior_s_per_item=prior, lane=track.lane))

    state.on_bar = on_bar
    splitter = FrameSplitter(state.feed_line, state.feed_frame, sample_bytes=0)  # every frame
    for line in lines:
        splitter.feed((line if line.endswith("\n") else line + "\n").encode("utf-8", "surrogateescape"))
        yield from rows
        rows.clear()
    splitter.flush()
    yield from rows


@dataclass
class StepRow:
    line: int  # the line of the step
    step: float  # optimizer steps done
    total_steps: float | None  # as the parser knows it at that line (the plan, epochs x steps per epoch)
    elapsed_s: float | None  # the training clock: seconds since the first step (the log's timestamps)
    eta_s: float | None
    eta_low_s: float | None
    eta_high_s: float | None


def replay_steps(lines: Iterable[str], horizon: float | None = None) -> Iterator[StepRow]:
    """One row per training step line, each with the ETA the tailer's state JSON gives then
    (`training`: eaglelab.host.parse.training through the same state machine and bar_eta).
    horizon: estimate the time to reach that many steps instead of the total the log announces."""
    state = LogState(bar_eta=bar_eta)
    splitter = FrameSplitter(state.feed_line, state.feed_frame, sample_bytes=0)
    seen = None
    for line in lines:
        splitter.feed((line if line.endswith("\n") else line + "\n").encode("utf-8", "surrogateescape"))
        steps = state.training
        if steps.step is None or (steps.step, steps.last_line) == seen:
            continue
        seen = (steps.step, steps.last_line)
        total = horizon if horizon is not None else steps.total
        elapsed = steps.history[-1][2] if steps.history else None
        eta = bar_eta(steps.history, total, "training steps", None) if total else (None, None, None)
        yield StepRow(steps.last_line or 0, steps.step, steps.total, elapsed, *eta)
