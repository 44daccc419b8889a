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

The one driver: `BarTracker` (bounded observations of one bar) and `bar_eta` over a parser's bar
history; the tailer, `lab parse`, `lab eta replay` and so `lab status` and the page all use it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eaglelab.figures import seconds

from .ensemble import Candidates, combine

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
# Bars that count completions of requests processed concurrently (vLLM's offline LLM.generate): the
# first completion comes after one "wave" of work and the rest arrive in bursts, so the first
# item's time is a latency, not a per-item time. The number is how many run at once (vLLM's
# default max_num_seqs); it only shapes the estimate while at most BURST_ITEMS have completed.
CONCURRENT_BARS = {"Processed prompts": 256}
BURST_ITEMS = 2


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
    source: str = "trend"  # trend | regime_change | rate | waves | done | ensemble | prior
    items_s: float | None = None  # seconds for the items left, before the item in progress is counted
    regime_start: float | None = None  # the count where the latest regime began (a step in the rate), if any

    def as_dict(self) -> dict:
        return {"eta_s": seconds(self.eta_s), "eta_low_s": seconds(self.eta_low_s),
                "eta_high_s": seconds(self.eta_high_s)}


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
                 printed_s_per_item: Sequence[float | None] | None = None,
                 concurrent: int | None = None) -> BarEstimate | None:
    """Estimate the time left for a bar from all its observations so far.

    points: (clock_s, n) in observation order (the bar's own elapsed time, or a line's timestamp);
    total: the bar's total (None: no ETA); now: the clock now (default: the last observation's);
    resolution: the clock's resolution in seconds (1.0 for tqdm's printed MM:SS elapsed);
    rate_hint_s_per_item: the rate the line printed, used only while the history has no segment;
    prior_s_per_item: where the history starts mid-bar (a log read from the middle), the rate the
    first frame printed: tqdm's summary of the part not seen, counted as one more (early) segment;
    printed_s_per_item: the rate each point's line printed (None where none), aligned with points:
    tqdm times items on an exact clock while the elapsed we fit is whole seconds, so on a fast bar
    the printed rate knows the current level better than the fit does (see _with_printed_rate);
    concurrent: items processed at once (CONCURRENT_BARS): while at most BURST_ITEMS are done, the
    time left counts waves of that many items, each as long as the first completion took.
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
    if concurrent and 0 < n_last <= BURST_ITEMS and points[0][1] == 0:
        # The first completions of a concurrent batch: one wave took t_reached; the rest of the
        # current wave comes soon (half a wave, say), then one wave per `concurrent` items. The
        # range runs from "all at once, now" to the straight extrapolation of the first items.
        wave = t_reached - points[0][0]
        waves_left = max(math.ceil(remaining_items / concurrent) - 1, 0)
        eta = max(wave * (waves_left + 0.5) - since, 0.0)
        linear = max(wave / n_last * remaining_items - since, eta)
        return BarEstimate(eta, 0.0, linear, wave / n_last, "waves")

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
    return BarEstimate(eta, min(low, eta), max(high, eta), p0, source, items_s=point,
                       regime_start=float(mids[0] - dns[0] / 2.0) if c > 0 else None)


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

    def __init__(self, total: float | None = None, resolution: float = 0.0, max_points: int = MAX_POINTS,
                 label: str = ""):
        self.total, self.resolution, self.max_points = total, resolution, max_points
        self.concurrent = CONCURRENT_BARS.get(label.strip().rstrip(":"))
        self.points: list[tuple[float, float]] = []
        self.rates: list[float | None] = []  # the rate each point's line printed, aligned with points
        self.rate_hint: float | None = None
        self.prior: float | None = None  # the first frame's printed rate, when it was seen mid-bar
        self.history_prior: float | None = None  # s/item of an earlier run of this bar (the caller's)
        self.history_run: tuple | None = None  # an earlier run's (n, elapsed_s) points (the caller's)
        self.restarts = 0
        self.cands = Candidates(resolution or 1.0)  # the simple estimators, for the online backtest
        self.whole_seconds = True  # every clock reading so far a whole second (tqdm's MM:SS, most timestamps)

    def add(self, clock: float, n: float, total: float | None = None, rate_s_per_item: float | None = None) -> None:
        if total is not None:
            self.total = total
        if clock != int(clock):
            self.whole_seconds = False
        if rate_s_per_item:
            self.rate_hint = rate_s_per_item
        if self.points and (n < self.points[-1][1] or clock < self.points[-1][0]):
            self.points, self.rates, self.restarts, self.prior = [], [], self.restarts + 1, None
            self.cands = Candidates(self.resolution or 1.0)
        if not self.points and n > 1:
            self.prior = rate_s_per_item  # history starts mid-bar: tqdm's rate summarizes the unseen part
        if not self.points or n > self.points[-1][1]:
            self.cands.add(clock, n, rate_s_per_item)
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

    def add_elapsed(self, elapsed_s: float, n: float, total: float | None = None,
                    rate_s_per_item: float | None = None) -> None:
        """add() with the bar's own printed elapsed time as the clock: tqdm's elapsed starts at 0
        with n = 0, so a history that starts at n = 1 gets that start point."""
        if not self.points and n == 1 and elapsed_s > 0:
            self.add(0.0, 0)
        self.add(elapsed_s, n, total, rate_s_per_item)

    def fit(self, total: float | None = None, now: float | None = None) -> BarEstimate | None:
        """The trend/regime fit alone (estimate_bar) on this bar's observations."""
        return estimate_bar(self.points, self.total if total is None else total, now=now,
                            resolution=self.resolution, rate_hint_s_per_item=self.rate_hint,
                            prior_s_per_item=self.prior, printed_s_per_item=self.rates,
                            concurrent=self.concurrent)

    def estimate(self, now: float | None = None, total: float | None = None) -> BarEstimate | None:
        """The bar's ETA: the fit and the simple estimators weighted by the online backtest
        (eaglelab.eta.ensemble); the history prior while the bar is too young to judge."""
        total = self.total if total is None else total
        fit = self.fit(total, now)
        if total is None or not self.points or (fit is not None and fit.source in ("done", "waves")):
            return fit
        n_last = self.points[-1][1]
        remaining = float(total - n_last)
        if remaining <= 0:
            return fit
        done = 0.0
        f_items = f_low = f_high = None
        if fit is not None and fit.items_s:
            done = max(fit.items_s - fit.eta_s, 0.0) if fit.eta_s > 0 else 0.0
            f_items, f_low, f_high = fit.items_s, fit.eta_low_s + done, fit.eta_high_s + done
            self.cands.set_fit(fit.items_s / remaining)
        got = combine(self.cands, remaining, f_items, f_low, f_high, self.history_prior,
                      regime_start=fit.regime_start if fit is not None else None, prior_run=self.history_run)
        if got is None:
            return fit
        items_s, lo, hi, weights = got
        p = items_s / remaining
        t_reached = next(c for c, k in self.points if k == n_last)
        now = self.points[-1][0] if now is None else max(now, self.points[-1][0])
        since = now - t_reached
        done_part = min(since, 0.9 * p)
        eta = max(items_s - done_part, 0.0)
        low = max(lo - done_part, 0.0)
        high = max(hi - done_part, eta)
        if since > p:  # the item in progress is overdue: the rest may go as slowly
            high = max(high, high * since / p)
        source = "prior" if "prior" in weights and weights["prior"] >= 0.5 else "ensemble"
        return BarEstimate(eta, min(low, eta), high, p, source, items_s=items_s)


def on_the_tick(eta: float, low: float, high: float) -> tuple[float, float, float]:
    """An ETA on a clock that ticks in whole seconds, put on the tick: the estimate to the nearest
    second, its range out to the whole seconds around it.

    On such a clock the time left, as it will be read off the log (the second the bar ends minus the
    second it reads now), is a whole number: a remaining R read from a random point of a second is
    floor(R) or floor(R) + 1, the second with probability frac(R), so its median is round(R). A range
    [2.3, 2.8] holds no whole second at all; [2, 3] holds both. Rounding moves an estimate by half a
    second at most, nothing on the hours a stage takes; on a bar with seconds left it is the
    difference between hitting the second and missing it (docs/eta.md, "tenth round")."""
    return float(math.floor(eta + 0.5)), float(math.floor(low)), float(math.ceil(high))


# bar_eta's trackers, kept between calls on the same growing history (the tailer's snapshots, a
# replay's every frame): id(history) -> (history, observations consumed, the last one, tracker).
_TRACKERS: dict[int, tuple[list, int, tuple, str, BarTracker]] = {}
_MAX_TRACKERS = 64


def _tracker_for(observations: Sequence[tuple], label: str) -> BarTracker:
    """The tracker of these observations, fed only those it has not seen when the same list grew
    since the last call (a list cleared or thinned in between starts a new one: same result)."""
    key = id(observations)
    hit = _TRACKERS.pop(key, None)
    start = 0
    if (hit is not None and hit[0] is observations and 0 < hit[1] <= len(observations)
            and observations[hit[1] - 1] is hit[2] and hit[3] == label):
        tracker, start = hit[4], hit[1]
    else:
        tracker = BarTracker(resolution=1.0, label=label)
    for n, tot, elapsed, rate in observations[start:]:
        if elapsed is not None:
            tracker.add_elapsed(elapsed, n, tot, rate)
    if isinstance(observations, list) and observations:
        _TRACKERS[key] = (observations, len(observations), observations[-1], label, tracker)
        if len(_TRACKERS) > _MAX_TRACKERS:
            del _TRACKERS[next(iter(_TRACKERS))]  # the least recently used
    return tracker


def bar_eta(observations: Sequence[tuple], total: float | None, label: str = "",
            tqdm_remaining_s: float | None = None, prior_s_per_item: float | None = None,
            prior_run: Sequence[tuple[float, float]] | None = None) -> tuple[float | None, float | None, float | None]:
    """(eta_s, eta_low_s, eta_high_s) of a bar from its observations (n, total, elapsed_s,
    printed s/it) to `total`: THE bar-ETA driver. The tailer's state JSON (so `lab status` and the
    page), `lab parse` and `lab eta replay` (so the benchmarks) all call it on the parser's bar
    history (eaglelab.host.parse.bars). The clock is the bar's printed elapsed (whole seconds);
    where nothing can be fitted yet, tqdm's printed remaining time with a x0.5..x2 range."""
    if total is not None and observations and observations[-1][0] >= total:
        return 0.0, 0.0, 0.0
    tracker = _tracker_for(observations, label)
    est = None
    tracker.history_prior = prior_s_per_item
    tracker.history_run = prior_run or None
    if tracker.points:
        est = tracker.estimate(total=total)
    if est is not None:
        if tracker.whole_seconds:
            return on_the_tick(est.eta_s, est.eta_low_s, est.eta_high_s)
        return est.eta_s, est.eta_low_s, est.eta_high_s
    if tqdm_remaining_s is None:
        return None, None, None
    return tqdm_remaining_s, tqdm_remaining_s * 0.5, tqdm_remaining_s * 2.0
