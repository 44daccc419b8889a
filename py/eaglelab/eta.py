"""ETAs: per progress bar, per phase, per stage and for the whole pipeline. Pure: no I/O, clock passed in.

Why not tqdm's own number: tqdm's remaining time is an exponential moving average (smoothing 0.3)
of the last few updates, so it jumps with every slow item and it is blind to a drifting rate (the
seeds' 64-shard load slowed from 16 to 29 s/shard and took 45-60 min where 31 were announced).

The bar estimator (`estimate_bar`) uses the whole observation history:
  1. consecutive observations become segments (items done, seconds taken); segments shorter than
     the clock's resolution are merged (printed elapsed times are whole seconds);
  2. a robust (Tukey bisquare, IRLS) weighted regression of log(seconds per item) on the item
     index gives the *shape* of the rate: its level now and its drift. A 100x slow first item is an
     outlier there and gets no weight;
  3. a run of consecutive segments at the end that all sit far on one side of the fit is a regime
     change (a collapse or a speed-up): the fit restarts at the change;
  4. the *level* is calibrated so that the fitted curve spends as much time as the bar really did
     (so periodic slow steps, e.g. evaluation pauses, count), leaving out early outliers only;
  5. the remaining time integrates the per-item time over the items left, the drift continued at
     half strength for at most as many items as were observed (a linear drift must not be
     extrapolated to the end of a long bar), the range from the level's uncertainty (how much the
     segments scatter, how many there are, the clock's resolution) and from the two extremes of
     the drift (stops now / continues in full).

Stage and pipeline ETAs (`annotate`) combine the current bar with the history of earlier runs of
the same stage on the same host and profile (see `RunRecord`), and propagate finish times through
the stages' `depends_on` DAG.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

# --- tuning (measured on bench/corpus with bench/bench_eta.py; see bench/RESULTS.md) ---------------
DRIFT_DAMPING = 0.5  # share of the fitted drift that is assumed to continue
RANGE_Z = 1.6  # half-width of the range in units of the level's log-scale uncertainty
RANGE_FLOOR = 0.08  # the range is never narrower than +-8% (model risk that no fit sees)
MIN_SEGMENTS_FOR_DRIFT = 5  # fewer segments: no drift term, level only
DRIFT_T = 2.0  # a drift is kept only when its slope is this many standard errors from 0
CHANGE_RUN = 2  # this many consecutive far-off segments at the end = a regime change
CHANGE_Z = 3.0  # "far off": beyond this many robust scales ...
CHANGE_MIN_LOG = math.log(1.5)  # ... and beyond a factor 1.5
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


def _robust_line(x: np.ndarray, y: np.ndarray, w: np.ndarray, drift: bool) -> tuple[float, float, float, np.ndarray]:
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
    if drift and b != 0.0:
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


def _integrate(p0: float, b: float, items: float, cap: float) -> float:
    """Seconds for `items` more items when the per-item time is p0*exp(b*u) for u <= cap, then flat."""
    if items <= 0:
        return 0.0
    u = min(items, cap)
    head = p0 * u if abs(b * u) < 1e-9 else p0 * (math.exp(b * u) - 1.0) / b
    return head + p0 * math.exp(b * u) * max(items - cap, 0.0)


def estimate_bar(points: Sequence[tuple[float, float]], total: float | None, *, now: float | None = None,
                 resolution: float = 0.0, rate_hint_s_per_item: float | None = None) -> BarEstimate | None:
    """Estimate the time left for a bar from all its observations so far.

    points: (clock_s, n) in observation order (the bar's own elapsed time, or a line's timestamp);
    total: the bar's total (None: no ETA); now: the clock now (default: the last observation's);
    resolution: the clock's resolution in seconds (1.0 for tqdm's printed MM:SS elapsed);
    rate_hint_s_per_item: the rate the line printed, used only while the history has no segment.
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
    keep = np.concatenate([[True], np.diff(n) > 0])  # first time each count was reached
    t, n = t[keep], n[keep]
    mids, dns, dts = _segments(t, n, max(2.0 * resolution, 1e-9))

    if len(dns) == 0:
        # Nothing to fit yet: the printed rate (if any) with a wide range, like tqdm would have.
        if not rate_hint_s_per_item or rate_hint_s_per_item <= 0:
            return None
        p = rate_hint_s_per_item
        eta = max(p * remaining_items - min(since, 0.9 * p), 0.0)
        return BarEstimate(eta, eta * 0.4, eta * 2.5 + since, p, "rate")

    y = np.log(dts / dns)
    span = max(float(mids[-1] - mids[0]), 1.0)
    x = (mids - mids[-1]) / span  # 0 at the latest segment, -1 at the first
    w = dns.copy()
    drift = len(dns) >= MIN_SEGMENTS_FOR_DRIFT
    a, b, scale, rw = _robust_line(x, y, w, drift)
    source = "trend"

    # A run of consecutive far-off segments at the end: the rate changed; fit only after the change.
    r = y - (a + b * x)
    far = np.abs(r) > max(CHANGE_Z * scale, CHANGE_MIN_LOG)
    run = 0
    while run < len(r) and far[-1 - run] and np.sign(r[-1 - run]) == np.sign(r[-1]):
        run += 1
    if CHANGE_RUN <= run < len(r):
        sl = slice(len(r) - run, None)
        mids, dns, dts, y = mids[sl], dns[sl], dts[sl], y[sl]
        span = max(float(mids[-1] - mids[0]), 1.0)
        x = (mids - mids[-1]) / span
        w = dns.copy()
        drift = len(dns) >= MIN_SEGMENTS_FOR_DRIFT
        a, b, scale, rw = _robust_line(x, y, w, drift)
        source = "regime_change"

    # Level: the fitted shape, scaled so that it spends as much time as the bar really did (so
    # periodic slow steps such as evaluation pauses count), leaving out the outliers of the first
    # fifth only: a slow start (warm-up, first batch) is not going to come back.
    k = len(dns)
    calib = ~((rw == 0) & (x < -0.8))
    fitted = np.exp(a + b * x[calib]) * dns[calib]
    level = float(np.sum(dts[calib]) / np.sum(fitted))
    # Drift per item (log scale), from per-span units.
    b_item = b / span
    cap = float(n_last - (mids[0] - dns[0] / 2))  # items observed in the fitted stretch
    p0 = math.exp(a + b * (n_last - mids[-1]) / span) * level  # per-item time at the current item

    def remaining(damping: float) -> float:
        return _integrate(p0, b_item * damping, remaining_items, cap)

    point = remaining(DRIFT_DAMPING)
    lo_drift, hi_drift = sorted((remaining(0.0), remaining(1.0)))

    # Uncertainty of the level (log scale): scatter of the segments over how many there are, the
    # clock's resolution over the time fitted, and the noise still to come over the items left.
    resid = np.log(dts / (np.exp(a + b * x) * level * dns))[calib]
    sigma_seg = max(float(np.sqrt(np.average(resid ** 2, weights=dns[calib]))), SCALE_FLOOR)
    k_eff = float(np.sum(dns[calib]) ** 2 / np.sum(dns[calib] ** 2))
    per_seg_items = float(np.mean(dns[calib]))
    sigma = math.sqrt(sigma_seg ** 2 / k_eff
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
        self.last = (clock, n)

    def eta(self, total: float | None) -> float | None:
        if total is None or self.last is None:
            return None
        dt = self._value(self._dt, self.alpha)
        if not dt:
            return None
        rate = self._value(self._dn, self.alpha) / dt
        return max(total - self.last[1], 0.0) / rate if rate > 0 else None


class BarTracker:
    """One bar's observations in bounded memory, for the tailer's state machine and for replay.

    `add` is O(1) amortized; `estimate` does the fit (call it when the state is written, not on
    every `\\r` frame). A count that goes backwards starts the bar afresh (a rerun, a new epoch)."""

    def __init__(self, total: float | None = None, resolution: float = 0.0, max_points: int = MAX_POINTS):
        self.total, self.resolution, self.max_points = total, resolution, max_points
        self.points: list[tuple[float, float]] = []
        self.rate_hint: float | None = None
        self.restarts = 0

    def add(self, clock: float, n: float, total: float | None = None, rate_s_per_item: float | None = None) -> None:
        if total is not None:
            self.total = total
        if rate_s_per_item:
            self.rate_hint = rate_s_per_item
        if self.points and (n < self.points[-1][1] or clock < self.points[-1][0]):
            self.points, self.restarts = [], self.restarts + 1
        if self.points and n == self.points[-1][1] and len(self.points) > 1 and n == self.points[-2][1]:
            self.points[-1] = (clock, n)  # a run of same-count frames: keep its first and its last
        else:
            self.points.append((clock, n))
        if len(self.points) > self.max_points:
            # Thin the older three quarters evenly; the recent quarter stays dense for the regime test.
            cut = (3 * len(self.points)) // 4
            self.points = self.points[0:1] + self.points[2:cut:2] + self.points[cut:]

    def estimate(self, now: float | None = None) -> BarEstimate | None:
        return estimate_bar(self.points, self.total, now=now, resolution=self.resolution,
                            rate_hint_s_per_item=self.rate_hint)
