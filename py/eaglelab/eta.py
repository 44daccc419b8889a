"""ETAs: per progress bar, per phase, per stage and for the whole pipeline. Pure: no I/O, clock passed in.

Why not tqdm's own number: tqdm's remaining time is an exponential moving average (smoothing 0.3)
of the last few updates, so it jumps with every slow item and it is blind to a drifting rate (the
seeds' 64-shard load slowed from 16 to 29 s/shard and took 45-60 min where 31 were announced).

The bar estimator (`estimate_bar`) uses the whole observation history:
  1. consecutive observations become segments (items done, seconds taken), merged until each
     spans two ticks of the clock (printed elapsed times are whole seconds);
  2. a clean step in the per-item time (a collapse, a warm cache, a 100x slow first item) starts a
     new regime; a step counts only when two levels split the segments cleanly and fit clearly
     better than a straight trend, so a gradual drift stays one regime;
  3. a robust (Tukey bisquare, IRLS) weighted regression of log(seconds per item) on the item
     index over the regime gives the rate's shape: its level now and its drift (kept only when
     significant); recent segments weigh more, but never fewer than 8 carry the weight;
  4. the level is calibrated so that the fitted curve spends as much time as the bar really did
     (so periodic slow steps, e.g. evaluation pauses, count), leaving out early outliers only;
     where the lines print a rate (tqdm times items on an exact clock, we fit whole seconds), the
     recent printed rates are a second estimate of the level, combined by inverse variance;
  5. the time left integrates the per-item time over the items left, the drift continued linearly
     at half strength for at most as many items as were observed and never beyond x2.5; the range
     adds the level's uncertainty (scatter over evidence, the rate's wander between blocks of the
     history, the clock's resolution, the noise still to come) to the two extremes of the drift
     (stops now / continues in full).

Stage and pipeline ETAs (`annotate`) combine the current bar with the history of earlier runs of
the same stage on the same host and profile (see `RunRecord`), and propagate finish times through
the stages' `depends_on` DAG.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .errors import RegistryError

# --- tuning (measured on bench/corpus with bench/bench_eta.py; see bench/RESULTS.md) ---------------
DRIFT_DAMPING = 0.5  # share of the fitted drift that is assumed to continue
RANGE_Z = 2.1  # half-width of the range in units of the level's log-scale uncertainty
RANGE_FLOOR = 0.08  # the range is never narrower than +-8% (model risk that no fit sees)
RECENCY = 0.5  # fit weights fall as exp(x / RECENCY): x = -1 at the regime's start, 0 now
RECENT_SEGMENTS = 8  # ... but a recency scale never spans fewer than this many segments
LEVEL_RECENCY = 0.5  # the level is calibrated with weights exp(x / LEVEL_RECENCY)
MIN_SEGMENTS_FOR_DRIFT = 5  # fewer segments: no drift term, level only
DRIFT_T = 2.0  # a drift is kept only when its slope is this many standard errors from 0
DRIFT_MAX = 2.5  # a drift changes the per-item time at most x2.5 (or /2.5) over its horizon
CHANGE_MIN_AFTER = 2  # a new regime needs at least this many segments after the step
CHANGE_MIN_LOG = math.log(1.5)  # a step in the per-item time of at least x1.5 (or /1.5) ...
CHANGE_CLEAN = 0.8  # ... with this share of each side cleanly on its side of the midpoint
CHANGE_VS_TREND = 0.8  # ... and a step that fits clearly better (x0.8 of the cost) than a trend
SCALE_FLOOR = 0.05  # robust log-scale never below this (identical quantized rates)
MAX_POINTS = 512  # a tracker keeps at most this many observations (thinned evenly, oldest first)


# ---------------------------------------------------------------------------------------------------
# Per bar
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BarEstimate:
    """Time left for a bar to reach its total, with a range; all seconds."""

    eta_s: float
    eta_low_s: float
    eta_high_s: float
    s_per_item: float | None = None  # the per-item time the estimate uses now
    source: str = "trend"  # trend | regime_change | single | rate | done

    def as_dict(self) -> dict:
        return {"eta_s": round(self.eta_s, 3), "eta_low_s": round(self.eta_low_s, 3),
                "eta_high_s": round(self.eta_high_s, 3)}


def _segments(t: np.ndarray, n: np.ndarray, min_dt: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mid item index, items, seconds) of consecutive stretches that took at least min_dt."""
    mids, dns, dts = [], [], []
    a = 0
    for b in range(1, len(t)):
        dn, dt = n[b] - n[a], t[b] - t[a]
        if dn > 0 and dt >= min_dt and dt > 0:
            mids.append((n[a] + n[b]) / 2.0)
            dns.append(dn)
            dts.append(dt)
            a = b
    return np.asarray(mids, float), np.asarray(dns, float), np.asarray(dts, float)


def _wmedian(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cw = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cw, cw[-1] / 2.0)])


def _robust_line(x: np.ndarray, y: np.ndarray, w: np.ndarray, drift: bool,
                 test: bool = True) -> tuple[float, float, float, np.ndarray]:
    """Tukey-bisquare IRLS fit y ~ a + b*x; returns a, b, robust scale, final weights.

    Starts from the weighted median (slope 0), so a huge outlier cannot drag the first fit."""
    a, b = _wmedian(y, w), 0.0
    scale = SCALE_FLOOR
    rw = np.ones_like(y)
    for _ in range(12):
        r = y - (a + b * x)
        scale = max(1.4826 * _wmedian(np.abs(r), w), SCALE_FLOOR)
        u = r / (4.685 * scale)
        rw = np.where(np.abs(u) < 1, (1 - u * u) ** 2, 0.0)
        ww = w * rw
        if ww.sum() <= 0:
            break
        if drift:
            xm = np.average(x, weights=ww)
            ym = np.average(y, weights=ww)
            sxx = float(np.sum(ww * (x - xm) ** 2))
            nb = float(np.sum(ww * (x - xm) * (y - ym)) / sxx) if sxx > 0 else 0.0
            na = ym - nb * xm
        else:
            na, nb = float(np.average(y, weights=ww)), 0.0
        if abs(na - a) < 1e-9 and abs(nb - b) < 1e-12:
            a, b = na, nb
            break
        a, b = na, nb
    if test and drift and b != 0.0:
        # Keep a drift only where the data show one (|slope| > DRIFT_T standard errors); noise
        # alone fits a slope, and an extrapolated spurious slope is worse than none.
        ww = w * rw
        xm = np.average(x, weights=ww)
        sxx = float(np.sum(ww * (x - xm) ** 2))
        r = y - (a + b * x)
        dof = max(float(np.sum(rw > 0)) - 2, 1.0)
        s2 = float(np.sum(ww * r * r) / np.sum(ww)) * float(np.sum(ww)) / dof
        se = math.sqrt(s2 / sxx) if sxx > 0 else math.inf
        if abs(b) < DRIFT_T * se:
            a, b = float(np.average(y, weights=ww)), 0.0
    return a, b, scale, rw


def _capped(dns: np.ndarray) -> np.ndarray:
    """Segment weights: items done, but no segment outweighs three typical ones (the stretch from
    0 to the first line of an excerpt that starts mid-bar averages over a long, different past)."""
    return np.minimum(dns, 3.0 * float(np.median(dns)))


def _changepoint(y: np.ndarray, w: np.ndarray) -> int:
    """Index of the first segment of the latest regime (0: one regime), by a clean two-level split.

    The split minimizing the weighted absolute deviation from each side's median is accepted when
    the two levels differ by more than CHANGE_MIN_LOG and the sides are cleanly apart (at least
    CHANGE_CLEAN of each side's weight on its own side of the midpoint): scattered outliers such as
    evaluation pauses never pass, a step does."""
    k = len(y)
    if k < 3:
        return 0
    cands = list(range(1, k - CHANGE_MIN_AFTER + 1))
    if len(cands) > 48:  # bounded work: a coarse grid over the old part, every split near the end
        cands = sorted(set(cands[:: max(len(cands) // 32, 1)] + cands[-16:]))
    best, best_c = math.inf, 0
    for c in cands:
        ma, mb = _wmedian(y[:c], w[:c]), _wmedian(y[c:], w[c:])
        cost = float(np.sum(w[:c] * np.abs(y[:c] - ma)) + np.sum(w[c:] * np.abs(y[c:] - mb)))
        if cost < best:
            best, best_c = cost, c
    if best_c == 0:
        return 0
    # A smooth drift is no step: keep one regime when a straight trend fits about as well.
    xs = np.arange(k, dtype=float) / k
    la, lb, _, _ = _robust_line(xs, y, w, True, test=False)
    if best > CHANGE_VS_TREND * float(np.sum(w * np.abs(y - (la + lb * xs)))):
        return 0
    c = best_c
    ma, mb = _wmedian(y[:c], w[:c]), _wmedian(y[c:], w[c:])
    if abs(mb - ma) < CHANGE_MIN_LOG:
        return 0
    mid, up = (ma + mb) / 2.0, mb > ma
    after_ok = np.sum(w[c:] * ((y[c:] > mid) == up)) / np.sum(w[c:])
    before_ok = np.sum(w[:c] * ((y[:c] > mid) != up)) / np.sum(w[:c])
    return c if after_ok >= CHANGE_CLEAN and before_ok >= CHANGE_CLEAN else 0


def _integrate(p0: float, b: float, items: float, cap: float) -> float:
    """Seconds for `items` more items when the per-item time goes linearly from p0 with relative
    slope b per item (p0 * (1 + b*u)) for u <= cap items, then stays where it got to. The factor
    (1 + b*cap) is kept within [1/DRIFT_MAX, DRIFT_MAX]."""
    if items <= 0:
        return 0.0
    end_factor = min(max(1.0 + b * cap, 1.0 / DRIFT_MAX), DRIFT_MAX)
    b = (end_factor - 1.0) / cap if cap > 0 else 0.0
    u = min(items, cap)
    head = p0 * (u + b * u * u / 2.0)
    return head + p0 * (1.0 + b * u) * max(items - cap, 0.0)


def _level_var(dts: np.ndarray, dns: np.ndarray, a: float, b: float, x: np.ndarray, level: float,
               calib: np.ndarray, lw: np.ndarray, resolution: float, k: int) -> float:
    """Variance (log scale) of the fitted level now: the segments' scatter over how many the level
    rests on, the clock's resolution over the time fitted, and little evidence when few segments."""
    resid = np.log(dts / (np.exp(a + b * x) * level * dns))[calib]
    sigma_seg = max(float(np.sqrt(np.average(resid ** 2, weights=dns[calib]))), SCALE_FLOOR)
    lw_d = (lw * dns)[calib]
    k_eff = float(np.sum(lw_d) ** 2 / np.sum(lw_d ** 2))
    return (sigma_seg ** 2 / k_eff + (resolution / max(float(np.sum(dts)), 1e-9)) ** 2 + (0.5 / k) ** 2)


def _with_printed_rate(p0: float, var_fit: float, printed: np.ndarray) -> float:
    """The per-item time now, combining the fit's level with the rates the lines printed.

    tqdm's printed rate is its EMA over the last updates timed on an exact clock: unbiased by the
    whole-second elapsed we fit, but jumpy. Both are taken as estimates of log(seconds per item)
    and weighted by inverse variance: the fit's from its own uncertainty, the printed rate's from
    the scatter of the recent printed values (their median is used). A steady fast bar (1 s ticks
    over a few seconds) leans on the printed rate; a slow or noisy one on the fit."""
    recent = printed[~np.isnan(printed)][-RECENT_SEGMENTS:]
    if len(recent) < 3:
        return p0
    lr = np.log(recent)
    var_rate = max(float(np.var(lr)), SCALE_FLOOR ** 2)
    w = var_fit / (var_fit + var_rate)  # the printed rate's share
    return math.exp((1.0 - w) * math.log(p0) + w * float(np.median(lr)))


def estimate_bar(points: Sequence[tuple[float, float]], total: float | None, *, now: float | None = None,
                 resolution: float = 0.0, rate_hint_s_per_item: float | None = None,
                 prior_s_per_item: float | None = None,
                 printed_s_per_item: Sequence[float | None] | None = None) -> BarEstimate | None:
    """Estimate the time left for a bar from all its observations so far.

    points: (clock_s, n) in observation order (the bar's own elapsed time, or a line's timestamp);
    total: the bar's total (None: no ETA); now: the clock now (default: the last observation's);
    resolution: the clock's resolution in seconds (1.0 for tqdm's printed MM:SS elapsed);
    rate_hint_s_per_item: the rate the line printed, used only while the history has no segment;
    prior_s_per_item: where the history starts mid-bar (a log read from the middle), the rate the
    first frame printed: tqdm's summary of the part not seen, counted as one more (early) segment;
    printed_s_per_item: the rate each point's line printed (None where none), aligned with points:
    tqdm times items on an exact clock while the elapsed we fit is whole seconds, so on a fast bar
    the printed rate knows the current level better than the fit does (see _with_printed_rate).
    """
    if total is None or not points:
        return None
    n_last = points[-1][1]
    if n_last >= total:
        return BarEstimate(0.0, 0.0, 0.0, None, "done")
    t_reached = next(c for c, k in points if k == n_last)  # when the current count was first seen
    now = points[-1][0] if now is None else max(now, points[-1][0])
    since = now - t_reached  # the item in progress has been running this long
    remaining_items = float(total - n_last)

    # Observations as arrays, n non-decreasing (a restart of the bar is the caller's business).
    t = np.asarray([p[0] for p in points], float)
    n = np.asarray([p[1] for p in points], float)
    printed = None
    if printed_s_per_item is not None and len(printed_s_per_item) == len(points):
        printed = np.asarray([r if r and r > 0 else np.nan for r in printed_s_per_item], float)
    keep = np.concatenate([[True], np.diff(n) > 0])  # first time each count was reached
    t, n = t[keep], n[keep]
    mids, dns, dts = _segments(t, n, max(2.0 * resolution, 1e-9))
    if prior_s_per_item and prior_s_per_item > 0 and len(dns):
        lead = float(np.median(dns))
        mids = np.concatenate([[n[0] - lead / 2.0], mids])
        dns = np.concatenate([[lead], dns])
        dts = np.concatenate([[prior_s_per_item * lead], dts])

    if len(dns) == 0:
        # Nothing to fit yet: the printed rate (if any) with a wide range, like tqdm would have.
        if not rate_hint_s_per_item or rate_hint_s_per_item <= 0:
            return None
        p = rate_hint_s_per_item
        eta = max(p * remaining_items - min(since, 0.9 * p), 0.0)
        return BarEstimate(eta, eta * 0.4, eta * 2.5 + since, p, "rate")

    # The latest regime: a step in the rate (a collapse, a speed-up, a slow first item) restarts the
    # history there; a gradual drift stays one regime and is fitted by the trend.
    y = np.log(dts / dns)
    c = _changepoint(y, _capped(dns))
    source = "trend" if c == 0 else "regime_change"
    mids, dns, dts, y = mids[c:], dns[c:], dts[c:], y[c:]
    span = max(float(mids[-1] - mids[0]), 1.0)
    x = (mids - mids[-1]) / span  # 0 at the latest segment, -1 at the first of the regime
    # Recency scales in x units (the regime spans x = -1..0), never shorter than RECENT_SEGMENTS
    # segments: with few segments a heavy recency weight would be tqdm's EMA again.
    seg = 1.0 / max(len(dns) - 1, 1)
    fit_scale = max(RECENCY, RECENT_SEGMENTS * seg)
    level_scale = max(LEVEL_RECENCY, RECENT_SEGMENTS * seg)
    w = _capped(dns) * np.exp(x / fit_scale)  # the whole history, the recent part weighing more
    drift = len(dns) >= MIN_SEGMENTS_FOR_DRIFT
    a, b, scale, rw = _robust_line(x, y, w, drift)

    # Level: the fitted shape, scaled so that it spends as much time as the bar really did, recent
    # segments weighing more (so periodic slow steps such as evaluation pauses count, and a curving
    # trend is met where it is now). Outliers of the first fifth stay out: a slow start (warm-up,
    # first batch) is not going to come back.
    k = len(dns)
    calib = ~((rw == 0) & (x < -0.8))
    lw = np.exp(x / level_scale) * calib
    level = float(np.sum(lw * dts) / np.sum(lw * np.exp(a + b * x) * dns))
    b_item = b / span  # relative change of the per-item time per item (d log p / d item)
    cap = float(n_last - (mids[0] - dns[0] / 2))  # items observed in the fitted stretch
    p0 = math.exp(a + b * (n_last - mids[-1]) / span) * level  # per-item time at the current item

    # The level's own uncertainty (log scale, see below), and the printed rate as a second look at it.
    var_fit_level = _level_var(dts, dns, a, b, x, level, calib, lw, resolution, k)
    p0_fit = p0
    if printed is not None:
        regime_start = float(mids[0] - dns[0] / 2.0)
        in_regime = printed[np.asarray([p[1] for p in points], float) > regime_start]
        p0 = _with_printed_rate(p0, var_fit_level, in_regime)

    def remaining(damping: float, p_now: float = p0) -> float:
        return _integrate(p_now, b_item * damping, remaining_items, cap)

    point = remaining(DRIFT_DAMPING)
    # The range spans both looks at the level (the fit alone, and the fit with the printed rate):
    # where they disagree, that disagreement is itself uncertainty.
    ends = [remaining(d, p_) for d in (0.0, 1.0) for p_ in {p0, p0_fit}]
    lo_drift, hi_drift = min(ends), max(ends)

    # Uncertainty of the level (log scale): scatter of the segments over how many there are, the
    # clock's resolution over the time fitted, and the noise still to come over the items left.
    resid = np.log(dts / (np.exp(a + b * x) * level * dns))[calib]
    sigma_seg = max(float(np.sqrt(np.average(resid ** 2, weights=dns[calib]))), SCALE_FLOOR)
    lw_d = (lw * dns)[calib]
    k_eff = float(np.sum(lw_d) ** 2 / np.sum(lw_d ** 2))  # segments the level effectively rests on
    per_seg_items = float(np.mean(dns[calib]))
    # Rates wander (a shared machine, a busy disk): the spread of the level between blocks of the
    # history, which does not shrink with more segments the way independent noise would.
    wander2 = 0.0
    cidx = np.flatnonzero(calib)
    blocks = min(8, len(cidx) // 3)
    if blocks >= 3:
        fit_t = np.exp(a + b * x) * level * dns
        parts = np.array_split(cidx, blocks)
        logs = [math.log(float(np.sum(dts[p_]) / np.sum(fit_t[p_]))) for p_ in parts]
        block_items = float(np.sum(dns[cidx])) / blocks
        wander2 = statistics.pvariance(logs) * min(1.0, block_items / max(remaining_items, 1.0)) * blocks / (blocks - 1)
    sigma = math.sqrt(sigma_seg ** 2 / k_eff + wander2
                      + sigma_seg ** 2 * per_seg_items / max(remaining_items, 1.0)
                      + (resolution / max(float(np.sum(dts)), 1e-9)) ** 2
                      + (0.5 / k) ** 2)  # few segments: little evidence at all
    width = max(RANGE_Z * sigma, RANGE_FLOOR)

    # The item in progress: it has run `since` already; if that is already longer than an item
    # should take, the rate may have collapsed: the high end assumes the rest goes as slowly.
    done_part = min(since, 0.9 * p0)
    eta = max(point - done_part, 0.0)
    low = max(min(point, lo_drift) * math.exp(-width) - done_part, 0.0)
    high = max(point, hi_drift) * math.exp(width) - done_part
    if since > p0:
        high = max(high, high * since / p0)
    return BarEstimate(eta, min(low, eta), max(high, eta), p0, source)


class TqdmEma:
    """tqdm's own remaining-time estimate (tqdm.std.EMA, smoothing 0.3), replayed over printed updates.

    tqdm updates both EMAs with (dn, dt) since the last print and shows (total - n) / (ema_dn / ema_dt)."""

    def __init__(self, smoothing: float = 0.3, start: tuple[float, float] | None = None):
        self.alpha = smoothing
        self._dn = [0.0, 0]  # [last, calls]
        self._dt = [0.0, 0]
        self.last = start  # (clock, n) of the previous print

    def _push(self, ema: list, x: float) -> None:
        ema[0] = self.alpha * x + (1 - self.alpha) * ema[0]
        ema[1] += 1

    @staticmethod
    def _value(ema: list, alpha: float) -> float:
        return ema[0] / (1 - (1 - alpha) ** ema[1]) if ema[1] else ema[0]

    def update(self, clock: float, n: float) -> None:
        if self.last is not None:
            dt, dn = clock - self.last[0], n - self.last[1]
            if dt > 0 and dn > 0:
                self._push(self._dn, dn)
                self._push(self._dt, dt)
            elif dn >= 0 and dt >= 0:
                return  # a frame printed within the same whole second: the next one carries its items
        self.last = (clock, n)

    def eta(self, total: float | None, n: float | None = None) -> float | None:
        """Time left from count n (default: the last update's) to total, at tqdm's smoothed rate."""
        if total is None or self.last is None:
            return None
        dt = self._value(self._dt, self.alpha)
        if not dt:
            return None
        rate = self._value(self._dn, self.alpha) / dt
        n = self.last[1] if n is None else n
        return max(total - n, 0.0) / rate if rate > 0 else None


class BarTracker:
    """One bar's observations in bounded memory, for the tailer's state machine and for replay.

    `add` is O(1) amortized; `estimate` does the fit (call it when the state is written, not on
    every `\\r` frame). A count that goes backwards starts the bar afresh (a rerun, a new epoch)."""

    def __init__(self, total: float | None = None, resolution: float = 0.0, max_points: int = MAX_POINTS):
        self.total, self.resolution, self.max_points = total, resolution, max_points
        self.points: list[tuple[float, float]] = []
        self.rates: list[float | None] = []  # the rate each point's line printed, aligned with points
        self.rate_hint: float | None = None
        self.prior: float | None = None  # the first frame's printed rate, when it was seen mid-bar
        self.restarts = 0

    def add(self, clock: float, n: float, total: float | None = None, rate_s_per_item: float | None = None) -> None:
        if total is not None:
            self.total = total
        if rate_s_per_item:
            self.rate_hint = rate_s_per_item
        if self.points and (n < self.points[-1][1] or clock < self.points[-1][0]):
            self.points, self.rates, self.restarts, self.prior = [], [], self.restarts + 1, None
        if not self.points and n > 1:
            self.prior = rate_s_per_item  # history starts mid-bar: tqdm's rate summarizes the unseen part
        if self.points and n == self.points[-1][1] and len(self.points) > 1 and n == self.points[-2][1]:
            self.points[-1] = (clock, n)  # a run of same-count frames: keep its first and its last
            self.rates[-1] = rate_s_per_item
        else:
            self.points.append((clock, n))
            self.rates.append(rate_s_per_item)
        if len(self.points) > self.max_points:
            # Thin the older three quarters evenly; the recent quarter stays dense for the regime test.
            cut = (3 * len(self.points)) // 4
            self.points = self.points[0:1] + self.points[2:cut:2] + self.points[cut:]
            self.rates = self.rates[0:1] + self.rates[2:cut:2] + self.rates[cut:]

    def estimate(self, now: float | None = None) -> BarEstimate | None:
        return estimate_bar(self.points, self.total, now=now, resolution=self.resolution,
                            rate_hint_s_per_item=self.rate_hint, prior_s_per_item=self.prior,
                            printed_s_per_item=self.rates)


# ---------------------------------------------------------------------------------------------------
# History of earlier runs (the run registry feeds it; see docs/interfaces.md, "## ETA")
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseRecord:
    """One finished phase of an earlier run."""

    name: str
    duration_s: float
    items: float | None = None  # what the phase's bar counted (shards, samples, steps), if it had one
    s_per_item: float | None = None  # duration_s / items where the phase had a bar


@dataclass(frozen=True)
class RunRecord:
    """One finished run of a stage: where, with which profile, and its phases in order."""

    stage: str
    host: str
    profile: str
    duration_s: float
    phases: tuple[PhaseRecord, ...] = ()
    state: str = "completed"
    run_id: str | None = None
    ended_at: str | None = None


@dataclass(frozen=True)
class History:
    """Earlier runs, plus expected sizes of phases (for phases with no history on this host/profile)."""

    runs: tuple[RunRecord, ...] = ()
    # {stage: {phase: items expected in this profile}}, e.g. {"extract": {"extraction": 10000}}
    expected_items: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict | None) -> "History":
        """The plain JSON shape (docs/interfaces.md, "## ETA") -> History. Unknown keys are ignored."""
        if not d:
            return cls()
        runs = []
        for i, r in enumerate(d.get("runs", [])):
            where = f"ETA history runs[{i}]"
            try:
                phases = tuple(PhaseRecord(name=str(p["name"]), duration_s=float(p["duration_s"]),
                                           items=_opt_float(p.get("items")), s_per_item=_opt_float(p.get("s_per_item")))
                               for p in r.get("phases") or [] if p.get("duration_s") is not None)
                dur = r.get("duration_s")
                dur = sum(p.duration_s for p in phases) if dur is None else float(dur)
                runs.append(RunRecord(stage=str(r["stage"]), host=str(r.get("host", "")),
                                      profile=str(r.get("profile", "")), duration_s=dur, phases=phases,
                                      state=str(r.get("state", "completed")),
                                      run_id=r.get("run_id") or r.get("id"), ended_at=r.get("ended_at")))
            except KeyError as e:
                raise RegistryError(f"{where}: missing key {e.args[0]!r}; each run needs `stage` and each "
                                    f"phase `name` and `duration_s` (docs/interfaces.md, ETA)") from None
            except (TypeError, ValueError, AttributeError) as e:
                raise RegistryError(f"{where}: {e}; durations are seconds (numbers), phases a list of "
                                    f"objects (docs/interfaces.md, ETA)") from None
        runs.extend(_runs_from_phase_rows(d.get("phases") or []))
        return cls(runs=tuple(runs), expected_items=dict(d.get("expected_items") or {}))

    def with_status_runs(self, status: dict) -> "History":
        """Plus the finished runs the status itself lists (their phases from their log state), so an
        ETA has history even where the registry kept no phase rows; a run already known is skipped."""
        known = {r.run_id for r in self.runs if r.run_id}
        extra = []
        for r in status.get("runs", []):
            if r.get("state") != "completed" or r.get("id") in known or r.get("duration_s") is None:
                continue
            ls = r.get("log_state") or {}
            phases = tuple(PhaseRecord(str(p.get("name")), float(p["duration_s"]))
                           for p in ls.get("phases") or [] if p.get("duration_s") is not None)
            extra.append(RunRecord(stage=str(r.get("stage")), host=str(r.get("host")),
                                   profile=str(r.get("profile") or status.get("profile") or ""),
                                   duration_s=float(r["duration_s"]), phases=phases, run_id=r.get("id"),
                                   ended_at=r.get("ended_at")))
        return History(runs=self.runs + tuple(extra), expected_items=self.expected_items)

    def same(self, stage: str, host: str, profile: str) -> list[RunRecord]:
        """Completed runs of this stage on this host with this profile, oldest first."""
        return [r for r in self.runs if r.stage == stage and r.host == host and r.profile == profile
                and r.state == "completed"]

    def other(self, stage: str) -> list[RunRecord]:
        return [r for r in self.runs if r.stage == stage and r.state == "completed"]


@dataclass(frozen=True)
class Span:
    """A duration estimate with its range (seconds) and where it came from."""

    eta_s: float
    low_s: float
    high_s: float
    source: str  # progress | history | size | other_host | elapsed | none

    def __add__(self, other: "Span") -> "Span":
        src = self.source if self.source == other.source else "mixed"
        return Span(self.eta_s + other.eta_s, self.low_s + other.low_s, self.high_s + other.high_s, src)


ZERO = Span(0.0, 0.0, 0.0, "done")
HISTORY_WIDEN = 0.15  # phase durations from history: the range is [min, max] of earlier runs, +-15%
OTHER_WIDEN = 1.0  # from another host/profile: x0.5 .. x2


def _runs_from_phase_rows(rows: list[dict]) -> list[RunRecord]:
    """The registry's flat phase rows ({run_id, stage, host, profile, phase, duration_s, items,
    rate_s_per_item, ended_at}, oldest first) grouped into runs, phases in the order they ended."""
    by_run: dict[str, list[dict]] = {}
    for i, row in enumerate(rows):
        for key in ("run_id", "stage", "phase"):
            if row.get(key) is None:
                raise RegistryError(f"ETA history phases[{i}]: missing key {key!r}; each phase row needs "
                                    f"run_id, stage, phase and duration_s (docs/interfaces.md, ETA)")
        by_run.setdefault(str(row["run_id"]), []).append(row)
    out = []
    for run_id, prows in by_run.items():
        try:
            phases = tuple(PhaseRecord(str(p["phase"]), float(p["duration_s"]), _opt_float(p.get("items")),
                                       _opt_float(p.get("rate_s_per_item", p.get("s_per_item"))))
                           for p in prows if p.get("duration_s") is not None and p["phase"] != WHOLE_RUN)
            whole = [float(p["duration_s"]) for p in prows if p["phase"] == WHOLE_RUN and p.get("duration_s") is not None]
        except (TypeError, ValueError) as e:
            raise RegistryError(f"ETA history phases of run {run_id}: {e}; duration_s, items and "
                                f"rate_s_per_item are numbers (docs/interfaces.md, ETA)") from None
        first = prows[0]
        # `__run__` is the whole run (it includes time outside every phase), not one more phase.
        duration = whole[-1] if whole else sum(p.duration_s for p in phases)
        out.append(RunRecord(stage=str(first["stage"]), host=str(first.get("host") or ""),
                             profile=str(first.get("profile") or ""), duration_s=duration,
                             phases=phases, run_id=run_id, ended_at=prows[-1].get("ended_at")))
    return out


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _from_durations(durations: list[float], source: str, widen: float) -> Span:
    med = statistics.median(durations)
    return Span(med, min(durations) / (1 + widen), max(durations) * (1 + widen), source)


def phase_estimate(history: History, stage: str, host: str, profile: str, phase: str) -> Span | None:
    """How long a phase that has not begun will take: same stage+host+profile history, else the
    expected size times a rate measured elsewhere, else the same phase elsewhere (wide range).
    WHOLE_RUN: the whole run of a stage whose runs name no phases."""
    if phase == WHOLE_RUN:
        same = [r.duration_s for r in history.same(stage, host, profile)]
        if same:
            return _from_durations(same, "history", HISTORY_WIDEN)
        other = [r.duration_s for r in history.other(stage)]
        return _from_durations(other, "other_host", OTHER_WIDEN) if other else None
    same = [p.duration_s for r in history.same(stage, host, profile) for p in r.phases if p.name == phase]
    if same:
        return _from_durations(same, "history", HISTORY_WIDEN)
    others = [p for r in history.other(stage) for p in r.phases if p.name == phase]
    items = (history.expected_items.get(stage) or {}).get(phase)
    rates = [p.s_per_item for p in others if p.s_per_item]
    if items and rates:
        return _from_durations([items * r for r in rates], "size", OTHER_WIDEN)
    if others:
        return _from_durations([p.duration_s for p in others], "other_host", OTHER_WIDEN)
    return None


def phase_template(history: History, stage: str, host: str, profile: str) -> list[str]:
    """The phases a run of this stage goes through, from its latest earlier run (same place first)."""
    for runs in (history.same(stage, host, profile), history.other(stage)):
        for r in reversed(runs):
            if r.phases:
                return [p.name for p in r.phases]
    return [WHOLE_RUN] if history.other(stage) else []  # runs known, phases not: the run is one phase


def run_duration_estimate(history: History, stage: str, host: str, profile: str) -> Span | None:
    """A whole run of a stage that has not started: the sum of its phases' estimates, or whole-run
    durations of earlier runs where the phases are not known."""
    names = phase_template(history, stage, host, profile)
    spans = [phase_estimate(history, stage, host, profile, p) for p in names]
    if names and all(s is not None for s in spans):
        total = spans[0]
        for s in spans[1:]:
            total = total + s
        return total
    same = [r.duration_s for r in history.same(stage, host, profile)]
    if same:
        return _from_durations(same, "history", HISTORY_WIDEN)
    other = [r.duration_s for r in history.other(stage)]
    if other:
        return _from_durations(other, "other_host", OTHER_WIDEN)
    return None


# ---------------------------------------------------------------------------------------------------
# Per run (phase by phase) and the pipeline DAG
# ---------------------------------------------------------------------------------------------------

READY_PHASES = ("ready", "serving")  # a service is "done" for the DAG once its log says it is ready
WHOLE_RUN = "__run__"  # the registry's phase row for a run whose log named no phases


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    t = _dt.datetime.fromtimestamp(ts, _dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _epoch(s: str | None) -> float | None:
    if not s:
        return None
    return _dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _progress_span(progress: dict | None, now: float) -> Span | None:
    """The current bar's remaining time from the state JSON's progress (the tailer's estimate)."""
    if not progress:
        return None
    n, total = progress.get("n"), progress.get("total")
    if total is not None and n is not None and n >= total:
        return None  # the bar is done; the phase goes on without it
    eta = progress.get("eta_s")
    if eta is None:
        rate = progress.get("rate_s_per_it")
        if rate is None or total is None or n is None:
            return None
        eta = rate * (total - n)
    low, high = progress.get("eta_low_s"), progress.get("eta_high_s")
    if low is None or high is None:  # a bar estimated by tqdm only: tqdm's number, a wide range
        low, high = eta * 0.5, eta * 2.0
    # The observation may be older than now (the tailer throttles): count the time since.
    seen = _epoch(progress.get("observed_at"))
    since = max(now - seen, 0.0) if seen is not None else 0.0
    return Span(max(eta - since, 0.0), max(low - since, 0.0), max(high - since, eta - since, 0.0), "progress")


def run_eta(run: dict, history: History, profile: str, now: float) -> dict | None:
    """ETA of a running run: the current phase (its bar, else its history minus the time it has
    run) plus every later phase of the stage's template. None for runs that are not running.

    Where the log names no phase, the current one is the template's first unfinished phase (for a
    stage whose runs have no phases, WHOLE_RUN: the run itself)."""
    if run.get("state") != "running":
        return None
    stage, host = run.get("stage", ""), run.get("host", "")
    log = run.get("log_state") or {}
    done = [p for p in log.get("phases") or [] if p.get("duration_s") is not None and p.get("name") != log.get("phase")]
    done_names = {p["name"] for p in done}
    template = phase_template(history, stage, host, profile)
    current = log.get("phase") or next((p for p in template if p not in done_names), None)
    started = _epoch(run.get("started_at"))
    run_elapsed = max(now - started, 0.0) if started is not None else None
    # Time outside every phase (interpreter start, imports, teardown) shows only in whole-run
    # durations: earlier runs' median of (duration - their phases), spent first.
    same = history.same(stage, host, profile)
    gaps = [max(r.duration_s - sum(p.duration_s for p in r.phases), 0.0) for r in same if r.phases]
    overhead = statistics.median(gaps) if gaps else 0.0
    log_phases = log.get("phases") or []
    first_t0 = _epoch(log_phases[0].get("started_at")) if log_phases else None
    if run_elapsed is None:
        overhead_left = 0.0
    elif not log_phases:
        overhead_left = max(overhead - run_elapsed, 0.0)  # nothing has started yet
    elif first_t0 is not None and started is not None:
        overhead_left = max(overhead - (first_t0 - started), 0.0)
    else:
        overhead_left = 0.0
    open_phase = next((p for p in log_phases if p.get("name") == current and p.get("duration_s") is None), {})
    phase_t0 = _epoch(open_phase.get("started_at"))  # the tailer stamps a phase's start (live)
    if phase_t0 is not None:
        in_phase = max(now - phase_t0, 0.0)
    elif not log_phases:
        in_phase = max((run_elapsed or 0.0) - overhead, 0.0)
    else:
        in_phase = max(run_elapsed - sum(p["duration_s"] for p in done), 0.0) if run_elapsed is not None else 0.0

    phases_out: list[dict] = [{"name": p["name"], "state": "done", "duration_s": p["duration_s"]} for p in done]
    if current in READY_PHASES or (run.get("kind") == "service" and log.get("ready")):
        current_span: Span | None = ZERO  # a service that is up: done, as far as the pipeline waits
    else:
        current_span = _progress_span(log.get("progress"), now)
        hist = phase_estimate(history, stage, host, profile, current) if current and current_span is None else None
        if hist is not None:
            left = lambda d: max(d - in_phase, 0.0)  # noqa: E731
            # Already longer than any earlier run: a little more at least, and a range that says so.
            current_span = Span(left(hist.eta_s), left(hist.low_s), max(left(hist.high_s), hist.eta_s * 0.1),
                                hist.source)
    if current is None and current_span is None:
        current_span = Span(0.0, 0.0, 0.0, "none")  # no phase, no bar, no template: nothing known to wait for
    if current:
        entry: dict[str, Any] = {"name": current, "state": "running"}
        if current_span is not None:
            entry.update(_span_fields(current_span, now))
        phases_out.append(entry)
    unknown = current_span is None
    total = current_span or ZERO

    # Later phases: the template's after the current one (those not seen, if it is not in the template).
    later = (template[template.index(current) + 1:] if current in template
             else [p for p in template if p not in done_names and p != current])
    for name in later:
        span = phase_estimate(history, stage, host, profile, name)
        entry = {"name": name, "state": "pending"}
        if span is None:
            unknown = True
        else:
            entry["expected_duration_s"] = round(span.eta_s, 3)
            entry.update(_span_fields(span, now, start=total))
            total = total + span
        phases_out.append(entry)
    if overhead_left > 0 and not unknown:
        total = total + Span(overhead_left, overhead_left / (1 + HISTORY_WIDEN), overhead_left * (1 + HISTORY_WIDEN),
                             total.source)
    out: dict[str, Any] = {"phases": phases_out}
    if unknown:
        out.update({"eta_s": None, "eta_low_s": None, "eta_high_s": None, "finish_at": None,
                    "source": "unknown"})
    else:
        out.update(_span_fields(total, now))
    return out


def _span_fields(span: Span, now: float, start: Span = ZERO) -> dict:
    return {"eta_s": round(start.eta_s + span.eta_s, 3),
            "eta_low_s": round(start.low_s + span.low_s, 3),
            "eta_high_s": round(start.high_s + span.high_s, 3),
            "finish_at": _iso(now + start.eta_s + span.eta_s),
            "source": span.source}


def pipeline_finish(stages: list[dict], runs_by_id: dict[str, dict], run_etas: dict[str, dict],
                    history: History, profile: str, now: float) -> tuple[dict[str, dict], dict]:
    """Finish times (eta / low / high, epoch seconds) of every stage through depends_on, and the
    pipeline's: a stage starts when the last of its dependencies finishes (or now)."""
    by_name = {s["name"]: s for s in stages}
    memo: dict[str, dict] = {}

    def finish(name: str, trail: tuple = ()) -> dict:
        if name in memo:
            return memo[name]
        if name in trail:
            raise ValueError(f"dependency cycle among stages: {' -> '.join(trail + (name,))}")
        st = by_name[name]
        deps = [d for d in (st.get("depends_on") or []) + (st.get("needs") or []) if d in by_name]
        dep_f = [finish(d, trail + (name,)) for d in deps]
        run = runs_by_id.get(st.get("latest_run") or "") or {}
        state = run.get("state") or st.get("state") or "pending"
        rec: dict[str, Any] = {"state": state}
        if state == "completed":
            end = _epoch(run.get("ended_at")) or now
            rec.update(eta=end, low=end, high=end, source="done")
        elif state == "running" and name in run_etas and run_etas[name].get("eta_s") is not None:
            e = run_etas[name]
            rec.update(eta=now + e["eta_s"], low=now + e["eta_low_s"], high=now + e["eta_high_s"],
                       source=e.get("source", "progress"))
        else:
            # Not started (or failed/killed: assumed started again): after its dependencies, or now.
            unknown_dep = any(f["eta"] is None for f in dep_f)
            start = max([now] + [f["eta"] for f in dep_f if f["eta"] is not None])
            start_lo = max([now] + [f["low"] for f in dep_f if f["low"] is not None])
            start_hi = max([now] + [f["high"] for f in dep_f if f["high"] is not None])
            dur = run_duration_estimate(history, name, st.get("host", ""), profile)
            if state == "running":  # running but no estimate of its own: elapsed vs history
                started = _epoch(run.get("started_at")) or now
                start = start_lo = start_hi = started
            if dur is None or unknown_dep:
                rec.update(eta=None, low=None, high=None, source="unknown")
            else:
                rec.update(eta=max(start + dur.eta_s, now), low=max(start_lo + dur.low_s, now),
                           high=max(start_hi + dur.high_s, now), source=dur.source)
            rec["start"] = start
            if state in ("failed", "killed"):
                rec["assumes_rerun"] = True
        rec["after"] = max(((f["eta"], d) for f, d in zip(dep_f, deps) if f["eta"] is not None), default=(None, None))[1]
        memo[name] = rec
        return rec

    for s in stages:
        finish(s["name"])
    known = {n: r for n, r in memo.items() if r["eta"] is not None}
    unknown = sorted(n for n, r in memo.items() if r["eta"] is None)
    if not known or unknown:
        return memo, {"finish_at": None, "finish_low_at": None, "finish_high_at": None,
                      "critical_path": [], "unknown": unknown}
    last = max(known, key=lambda n: known[n]["eta"])
    path = [last]
    while memo[path[-1]].get("after"):
        path.append(memo[path[-1]]["after"])
    path.reverse()
    return memo, {"finish_at": _iso(max(r["eta"] for r in known.values())),
                  "finish_low_at": _iso(max(r["low"] for r in known.values())),
                  "finish_high_at": _iso(max(r["high"] for r in known.values())),
                  "eta_s": round(max(r["eta"] for r in known.values()) - now, 3),
                  "critical_path": path, "unknown": []}


def annotate(status: dict, history: dict | History | None, now: float) -> dict:
    """Add ETA fields to a `lab status --json` object (a new dict; existing fields are kept as they are).

    runs[*].eta, stages[*].eta and top-level `pipeline`; see docs/interfaces.md, "## ETA"."""
    hist = (history if isinstance(history, History) else History.from_dict(history)).with_status_runs(status)
    profile = status.get("profile", "")
    out = dict(status)
    runs = [dict(r) for r in status.get("runs", [])]
    run_etas: dict[str, dict] = {}  # by stage, for the run that is the stage's latest
    latest = {s.get("latest_run") for s in status.get("stages", [])}
    for r in runs:
        e = run_eta(r, hist, profile, now)
        if e is not None:
            r["eta"] = e
            if r.get("id") in latest:
                run_etas[r.get("stage", "")] = e
    out["runs"] = runs
    stages = [dict(s) for s in status.get("stages", [])]
    memo, pipe = pipeline_finish(stages, {r.get("id"): r for r in runs}, run_etas, hist, profile, now)
    for s in stages:
        m = memo[s["name"]]
        s["eta"] = {"eta_s": None if m["eta"] is None else round(max(m["eta"] - now, 0.0), 3),
                    "eta_low_s": None if m["low"] is None else round(max(m["low"] - now, 0.0), 3),
                    "eta_high_s": None if m["high"] is None else round(max(m["high"] - now, 0.0), 3),
                    "finish_at": _iso(m["eta"]), "finish_low_at": _iso(m["low"]),
                    "finish_high_at": _iso(m["high"]), "source": m["source"]}
        if m.get("start") is not None and m["state"] != "running" and m["eta"] is not None:
            s["eta"]["start_at"] = _iso(m["start"])  # (no start time for a stage whose finish is unknown)
        if m.get("assumes_rerun"):
            s["eta"]["assumes_rerun"] = True
    out["stages"] = stages
    out["pipeline"] = pipe
    return out
