"""Bar ETA accuracy on the log corpus, ours beside every simple rule, per class, held-out split.

    .venv/bin/python bench/bench_eta.py [--split holdout|tuning|all] [--per-bar] [--synthetic] [--apart LIST]
    .venv/bin/python bench/bench_eta.py --corpus DIR   (make bench-outside CORPUS=DIR)
    (make bench-eta: the held-out part, and the thirteenth round's new logs of it apart)

--corpus DIR scores the logs under DIR instead (every *.log, or those its LABELS.tsv names): a corpus
kept outside this repository, which nobody here tuned on or committed (somebody else's collection,
e.g. in ../shared/). A log whose bytes the committed corpus or the parser's fixtures already hold is
not unseen: it is left out and named.

Corpus: every log in bench/corpus/SPLIT.tsv (bench/corpus/{public,real,recorded} and the parser's
fixture logs, tests/fixtures/logs; sources in bench/corpus/SOURCES.md, LABELS.tsv and
tests/fixtures/logs/SOURCES.md). The split is by source (a repository, or one of this lab's
recording scripts), written once into SPLIT.tsv; the estimator's constants are looked at on the
tuning part only, and the figures to quote are the held-out part's (the default).

Every log goes through the same replay as `lab eta replay` (eaglelab.eta.replay: the tailer's
frame splitter and state machine, bar_eta on the parser's bar history). Every bar is scored up to
the last count the log shows (its total where it gets there): the replay runs a second time with
that count as the bar's horizon; the truth at a frame is the time from it to the first frame at
that count; frames under 2 s from it are skipped. At each scored frame, every method estimates
the time to that count:
  ours      eta_s of the replay (what lab status and the page show)
  tqdm      the remaining time the frame printed (scaled to the horizon); where the frame printed
            none (frames cut at the terminal width, step records), tqdm's EMA replayed
  ema       tqdm's EMA (smoothing 0.3) replayed over the frames
  slope     the rate over the last 5 frames (at least 2 clock ticks; the mean rate before that)
  mean      the whole history's mean rate (elapsed / n; from the first frame on a line clock)
  prior     the history prior: the bar's earlier run in the same log (the epoch before), else the
            median s/item of bars with the same label in the tuning logs (other logs only), else
            of all tuning bars
Figures: the median over bars of each bar's median relative error |eta - truth| / truth, our
ratio to each method, per class; coverage of [eta_low_s, eta_high_s] over the observations (and
the mean over bars of each bar's coverage) and the median relative width (eta_high_s - eta_low_s)
/ truth. Beside the best rule, a 90% bootstrap interval of our ratio to it (the bars resampled):
a class of four bars can win or lose by one bar's luck, and "(within chance)" says so. Last, a
ceiling: "hindsight", the error of the rule that turned out best at each frame, chosen after the
fact (no estimator can know it), as a ratio to tqdm's: a goal below it asks more than choosing well.
A second line per class says what the whole-second tick is worth. The truth is read off the log's
clock, whole seconds for tqdm's MM:SS, and ours is put on that tick (estimator.on_the_tick): there,
every rule put on the tick the same way ("rules on the tick": rounded to the nearest second), our
ratio to the best of them, and the error beyond the tick (|eta - truth| less one tick, over the
truth: what is left once any estimate within a second of the truth counts as exact), ours and tqdm's.
Classes (read off the whole bar, for reporting only: the estimator never sees them):
  rate change   the per-item time of the last half of the items differs from the first half's
                by x1.25 or more (drift, a step, shards of different sizes, warm then cold)
  long steady   not a rate change, 40 or more frames over 100 or more items
  no printed ETA  most frames print no remaining time (cut at the terminal width, step records)
  short         the rest
  complete      (overlapping) bars that reach their own total in the log
Synthetic scenarios (tqdm's own output on a simulated clock) are reported apart (--synthetic), and so
are concurrent bars after the first of their key (the parser's lanes, `label [lane 2]`: ReplayRow.lane).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import itertools
import math
import multiprocessing
import operator
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from eaglelab.eta.estimator import on_the_tick
from eaglelab.eta.replay import replay

SPLIT = ROOT / "bench" / "corpus" / "SPLIT.tsv"
MIN_TRUTH_S = 2.0
RECENT = 5
METHODS = ("ours", "tqdm", "ema", "slope", "mean", "prior")
RULES = ("tqdm", "ema", "slope", "mean")  # the simple rules ours must beat (the prior is reported, not a rule)
# The same rules put on the log's whole-second tick as ours is (estimator.on_the_tick), and the error
# beyond the tick: a fair look at what rounding gives (docs/eta.md, "tenth round"). Reported, not goals.
TICKED = tuple(f"{m}@" for m in RULES)
BEYOND = ("ours~", "tqdm~")
CLASSES = ("rate change", "long steady", "no printed ETA", "short")


def load_split() -> list[tuple[str, str, str]]:
    """[(path, source, split)] from bench/corpus/SPLIT.tsv."""
    rows = [r for r in SPLIT.read_text().splitlines() if r and not r.startswith("#")]
    return [(r["path"], r["source"], r["split"]) for r in csv.DictReader(rows, delimiter="\t")]


@dataclass
class BarScore:
    name: str
    split: str
    errs: dict = field(default_factory=lambda: {m: [] for m in METHODS + TICKED + BEYOND})
    covered: int = 0
    widths: list = field(default_factory=list)
    cls: str = "short"
    complete: bool = False
    lane: bool = False  # a concurrent bar after the first of its key (the parser's `label [lane 2]`, ...)

    @property
    def obs(self) -> int:
        return len(self.errs["ours"])


def norm_label(label: str) -> str:
    return (label or "(bar)").strip().rstrip(":").lower()


def bar_rate(rows) -> float | None:
    rows = [r for r in rows if r.elapsed_s is not None]
    if not rows:
        return None
    a, b = rows[0], rows[-1]
    if b.elapsed_clock and b.n > 0 and b.elapsed_s > 0:
        return b.elapsed_s / b.n
    if b.n > a.n and b.elapsed_s > a.elapsed_s:
        return (b.elapsed_s - a.elapsed_s) / (b.n - a.n)
    return None


def classify(rows, truthful: int) -> str:
    """The bar's class from its whole history (reporting only)."""
    pts = [(r.elapsed_s, r.n) for r in rows if r.elapsed_s is not None]
    no_eta = sum(r.tqdm_eta_s is None for r in rows) > len(rows) / 2
    t = np.array([p[0] for p in pts], float)
    n = np.array([p[1] for p in pts], float)
    change = False
    if len(pts) >= 6 and n[-1] > n[0]:
        lo = n[0] + max(1.0, 0.05 * (n[-1] - n[0]))  # the first item (a warm-up) left out
        mid = (lo + n[-1]) / 2
        ta, tm, tb = (float(np.interp(x, n, t)) for x in (lo, mid, n[-1]))
        if tm > ta and tb > tm and mid > lo:
            r = ((tb - tm) / (n[-1] - mid)) / ((tm - ta) / (mid - lo))
            change = max(r, 1 / r) >= 1.25
    if change:
        return "rate change"
    if no_eta:
        return "no printed ETA"
    if len(pts) >= 40 and n[-1] - n[0] >= 100:
        return "long steady"
    return "short"


def _mean_eta(history, r) -> float | None:
    if r.elapsed_clock and r.n > 0:
        return r.elapsed_s / r.n * (r.total - r.n)
    a = history[0]
    if r.n > a.n and r.elapsed_s > a.elapsed_s:
        return (r.elapsed_s - a.elapsed_s) / (r.n - a.n) * (r.total - r.n)
    return None


def _slope_eta(history, r) -> float | None:
    i = len(history) - 1
    j = max(i - (RECENT - 1), 0)
    while j > 0 and history[i].elapsed_s - history[j].elapsed_s < 2 * r.resolution:
        j -= 1
    dt, dn = history[i].elapsed_s - history[j].elapsed_s, history[i].n - history[j].n
    if dn <= 0 or dt < 2 * r.resolution:
        return None
    return dt / dn * (r.total - r.n)


def scored_frames(rows):
    """The frames of one bar that are scored: (i, row, truth, total) for each frame before the bar's
    last count with 2 s or more to go, an estimate of ours and a mean rate to compare (rows: the bar's
    replay rows with a clock). Nothing when the bar never reaches the count it is scored to."""
    if len(rows) < 2 or rows[-1].total is None or rows[-1].n < rows[-1].total:
        return
    total = rows[-1].total
    t_end = next(r.elapsed_s for r in rows if r.n >= total)
    for i, r in enumerate(rows):
        if r.n >= total:
            return
        truth = t_end - r.elapsed_s
        if truth >= MIN_TRUTH_S and r.eta_s is not None and _mean_eta(rows[: i + 1], r) is not None:
            yield i, r, truth, total


def score_bar(name: str, split: str, rows, prior_rate: float | None, real_total) -> BarScore | None:
    rows = [r for r in rows if r.elapsed_s is not None]
    s = BarScore(name, split, complete=real_total is not None and bool(rows) and rows[-1].total is not None
                 and rows[-1].total >= real_total)
    # the clock has read whole seconds up to each frame (the estimator's own rule, BarTracker.whole_seconds)
    whole_so_far = list(itertools.accumulate((float(r.elapsed_s).is_integer() for r in rows), operator.and_))
    for i, r, truth, total in scored_frames(rows):
        hist = rows[: i + 1]
        mean = _mean_eta(hist, r)
        slope = _slope_eta(hist, r) or mean
        ema = r.ema_eta_s if r.ema_eta_s is not None else mean
        tqdm = r.tqdm_eta_s if r.tqdm_eta_s is not None else ema
        prior = (r.prior_s_per_item or prior_rate or 0.0) * (total - r.n)
        ests = {"ours": r.eta_s, "tqdm": tqdm, "ema": ema, "slope": slope, "mean": mean, "prior": prior}
        for m, v in ests.items():
            s.errs[m].append(abs(v - truth) / truth)
        whole = whole_so_far[i]
        for m in RULES:
            s.errs[f"{m}@"].append(abs((on_the_tick(ests[m], 0, 0)[0] if whole else ests[m]) - truth) / truth)
        # beyond the tick: the truth read off a whole-second clock is the time left to within a second
        # either way (both ends floored), so an estimate inside (truth - 1, truth + 1) may be exact
        tick = 1.0 if whole else 0.0
        for m in ("ours", "tqdm"):
            s.errs[f"{m}~"].append(max(abs(ests[m] - truth) - tick, 0.0) / truth)
        s.covered += (r.eta_low_s or 0.0) <= truth <= (r.eta_high_s or 0.0)
        s.widths.append(((r.eta_high_s or 0.0) - (r.eta_low_s or 0.0)) / truth)
    if not s.obs:
        return None
    s.cls = classify(rows, s.obs)
    return s


# --- the history prior: other tuning logs' bars of the same label -------------------------------


class PriorTable:
    def __init__(self) -> None:
        self.by_label: dict[str, list[tuple[str, float]]] = {}

    def add(self, log: str, label: str, rate: float) -> None:
        self.by_label.setdefault(norm_label(label), []).append((log, rate))

    def lookup(self, log: str, label: str) -> float | None:
        rates = [r for lg, r in self.by_label.get(norm_label(label), []) if lg != log]
        return statistics.median(rates) if rates else None

    def fallback(self, log: str) -> float | None:
        rates = [r for v in self.by_label.values() for lg, r in v if lg != log]
        return statistics.median(rates) if rates else None


def _bars(text: str, horizons=None, priors=None, estimate: bool = True) -> dict:
    out: dict = {}
    for row in replay(text.split("\n"), horizons=horizons, priors=priors, estimate=estimate):
        out.setdefault((row.key, row.instance), []).append(row)
    return out


def _bar_rates(path: str) -> list[tuple[str, float]]:
    """(label, mean s/item) of each bar of one log (interleaved concurrent bars left out)."""
    text = (ROOT / path).read_bytes().decode("utf-8", errors="replace")
    bars = _bars(text, estimate=False)  # counts and clocks only
    mixed = interleaved_keys(bars)
    rates = ((key[1], bar_rate(rows) if key not in mixed else None) for (key, _inst), rows in bars.items())
    return [(label, rate) for label, rate in rates if rate]


def build_priors(logs, pool=None) -> PriorTable:
    table = PriorTable()
    paths = [path for path, _src, split in logs if split == "tuning"]
    for path, rates in zip(paths, (pool.map if pool else map)(_bar_rates, paths)):
        for label, rate in rates:
            table.add(path, label, rate)
    return table


def scored_bars(text: str) -> tuple[dict, dict]:
    """Every bar of a log replayed up to the last count the log shows ({(key, instance): rows}), and
    each bar's own printed total ({(key, instance): total}: a bar scored to it is complete)."""
    first = _bars(text, estimate=False)  # where each bar's log ends: counts only, the estimates come after
    last = {k: rows[-1].n for k, rows in first.items() if any(r.elapsed_s is not None for r in rows)}
    return _bars(text, horizons=last), {k: rows[-1].total for k, rows in first.items()}


# Concurrent processes that draw bars of one label into one stream with no prefix (eight GPUs' jobs
# in one nohup file, three eval bars sharing a terminal) are read as one bar restarting at every
# switch: its "runs" start part way, with time already on their clock, which a real restart (an
# epoch, a retry, a resume from a checkpoint: elapsed 0) never does. Scoring those fragments would
# score the mix-up, not an estimate: a bar key with this many such starts is left out, and counted.
INTERLEAVED_STARTS = 10
# The parser keeps such bars apart as lanes (eaglelab.host.parse.bars; ReplayRow.lane). The first lane
# of a key is scored like any bar; the others are reported apart, not in the headline: eight GPUs'
# copies of one bar in one file would otherwise count as eight bars, and the headline stays
# comparable with the rounds before lanes.


def interleaved_keys(bars: dict) -> dict:
    """{key: runs} of the bar keys that look like concurrent bars interleaved (INTERLEAVED_STARTS)."""
    starts: dict = {}
    runs: dict = {}
    for (key, _inst), rows in bars.items():
        runs[key] = runs.get(key, 0) + 1
        first = next((r for r in rows if r.elapsed_s is not None), None)
        if first is not None and first.n > 0 and first.elapsed_s > 0:
            starts[key] = starts.get(key, 0) + 1
    return {k: runs[k] for k, c in starts.items() if c >= INTERLEAVED_STARTS}


def score_text(name: str, split: str, text: str,
               table: PriorTable | None) -> tuple[list[BarScore], int, list[str]]:
    """(the log's scored bars, how many bars had nothing to score, "path: label (N runs)" of each
    interleaved key left out)."""
    bars, real_totals = scored_bars(text)
    out, unscored = [], 0
    mixed = interleaved_keys(bars)
    # The estimator gets the history it would have here: the same bar's earlier run in this log
    # (replay does that itself). Other logs' bars of the same label are a different model, host
    # and disk: they make the prior baseline, not our input.
    for (key, inst), rows in bars.items():
        if key in mixed:
            continue
        fallback = table.lookup(name, key[1]) or table.fallback(name) if table else None
        s = score_bar(f"{name}:{key[1] or '(bar)'}#{inst}", split, rows, fallback, real_totals.get((key, inst)))
        if s is None:
            unscored += 1
        else:
            s.lane = rows[0].lane > 0
            out.append(s)
    return out, unscored, [f"{name}: {k[1] or '(bar)'} ({n} runs)" for k, n in mixed.items()]


# --- synthetic scenarios: per-item times, printed by tqdm itself on a simulated clock ----------


def tqdm_log(per_item: np.ndarray, desc: str, mininterval: float = 0.0, total: bool = True,
             unit: str = "it") -> str:
    """The log tqdm writes for these per-item times (its own format and EMA), clock simulated;
    total=False: a bar that prints no total (HF datasets' `Generating train split`)."""
    from tqdm import tqdm

    clock = [0.0]
    buf = io.StringIO()
    bar = tqdm(total=len(per_item) if total else None, desc=desc, file=buf, mininterval=mininterval,
               miniters=1, ascii=True, dynamic_ncols=False, ncols=100, unit=unit)
    bar._time = lambda: clock[0]  # tqdm reads its clock through this attribute
    bar.start_t = bar.last_print_t = 0.0
    for dt in per_item:
        clock[0] += float(dt)
        bar.update(1)
    bar.close()
    return buf.getvalue().replace("\r", "\n")


def synthetic_logs(seed: int = 7) -> dict[str, str]:
    rng = np.random.default_rng(seed)
    noise = lambda k, s=0.15: rng.lognormal(0.0, s, k)
    logs = {}
    seeds = 16 + 34 * (1 - np.exp(-np.arange(64) / 20.0))
    logs["seeds_like_drift_64"] = tqdm_log(seeds * noise(64, 0.08), "Loading safetensors checkpoint shards")
    logs["slow_first_item_1000"] = tqdm_log(np.r_[60.0, 0.6 * noise(999, 0.4)], "Processed prompts",
                                            mininterval=1.0)
    logs["collapse_mid_200"] = tqdm_log(np.r_[np.full(100, 2.0), np.full(100, 12.0)] * noise(200), "extract")
    pauses = np.full(600, 1.5) * noise(600, 0.2)
    pauses[99::100] += 60.0
    logs["eval_pauses_600"] = tqdm_log(pauses, "Training", mininterval=1.0)
    logs["constant_noisy_300"] = tqdm_log(3.0 * noise(300, 0.5), "Training")
    logs["speedup_warm_cache_85"] = tqdm_log(np.r_[np.full(20, 25.0), np.full(65, 5.0)] * noise(85), "shards")
    # no total, a wandering rate (examples of different sizes): the per-example time is an AR(1) walk
    # in log space around 1.5 s, as a datasets loading script's `Generating train split` prints it
    walk = np.zeros(300)
    for i in range(1, 300):
        walk[i] = 0.9 * walk[i - 1] + rng.normal(0.0, 0.25)
    logs["no_total_wander_300"] = tqdm_log(1.5 * np.exp(walk) * noise(300, 0.3), "Generating train split",
                                           total=False, unit=" examples")
    return logs


# --- report -------------------------------------------------------------------------------------


def figures(scores: list[BarScore]) -> dict:
    med = statistics.median
    fig = {m: med([med(s.errs[m]) for s in scores]) for m in METHODS + TICKED + BEYOND}
    # a ceiling, not a method: at every frame the simple rule that turned out best, chosen in hindsight
    fig["hindsight"] = med([med([min(s.errs[m][i] for m in RULES) for i in range(s.obs)]) for s in scores])
    obs = sum(s.obs for s in scores)
    fig["coverage"] = sum(s.covered for s in scores) / obs
    fig["coverage_bars"] = statistics.mean(s.covered / s.obs for s in scores)
    fig["width"] = med([w for s in scores for w in s.widths])
    fig["bars"], fig["obs"] = len(scores), obs
    return fig


def ratio_interval(scores: list[BarScore], rule: str, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 90% bootstrap interval of ours' figure over the rule's, resampling the bars: with a handful of
    bars in a class, a ratio of 1.8 may be one bar's luck; the interval says how far it can be trusted."""
    if len(scores) < 2:
        return math.nan, math.nan
    ours = np.array([statistics.median(s.errs["ours"]) for s in scores])
    rule_ = np.array([statistics.median(s.errs[rule]) for s in scores])
    idx = np.random.default_rng(seed).integers(0, len(scores), (resamples, len(scores)))
    num, den = np.median(ours[idx], axis=1), np.median(rule_[idx], axis=1)
    ratios = num[den > 0] / den[den > 0]
    if not len(ratios):
        return math.nan, math.nan
    return float(np.quantile(ratios, 0.05)), float(np.quantile(ratios, 0.95))


def report(label: str, scores: list[BarScore]) -> dict:
    if not scores:
        print(f"  {label:16s} no bar")
        return {}
    f = figures(scores)
    ratio = "  ".join(f"/{m} {f['ours'] / f[m]:.2f}" if f[m] else f"/{m} -" for m in METHODS[1:])
    best = min(RULES, key=lambda m: f[m])
    f["best_rule"], f["ratio_best"] = best, f["ours"] / f[best] if f[best] else float("inf")
    verdict = "beats every rule" if f["ratio_best"] < 1 else "LOSES"
    f["ratio_best_90"] = ratio_interval(scores, best)
    lo, hi = f["ratio_best_90"]
    if lo <= 1 <= hi:
        verdict += " (within chance)"
    ceiling = f"{f['hindsight'] / f['tqdm']:.2f}x tqdm" if f["tqdm"] else "-"
    print(f"  {label:16s} {f['bars']:3d} bars {f['obs']:5d} obs | ours {f['ours']:.3f} tqdm {f['tqdm']:.3f} "
          f"ema {f['ema']:.3f} slope {f['slope']:.3f} mean {f['mean']:.3f} prior {f['prior']:.3f} | "
          f"ours{ratio} | best rule {best} {f['ratio_best']:.2f} (90% {lo:.2f}-{hi:.2f}): {verdict} | "
          f"cov {f['coverage']:.1%} (bars {f['coverage_bars']:.0%}) width {f['width']:.2f} | hindsight {ceiling}")
    best_t = min(TICKED, key=lambda m: f[m])
    print(f"  {'':16s} rules on the tick: " + " ".join(f"{m[:-1]} {f[m]:.3f}" for m in TICKED)
          + f" | ours/{best_t[:-1]} on the tick {_ratio(f['ours'], f[best_t])} | beyond the tick: ours "
          f"{f['ours~']:.3f} tqdm {f['tqdm~']:.3f} ({_ratio(f['ours~'], f['tqdm~'])})")
    return f


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def report_all(title: str, scores: list[BarScore]) -> dict:
    print(title)
    out = {"all": report("all bars", scores), "complete": report("complete bars", [s for s in scores if s.complete])}
    for c in CLASSES:
        out[c] = report(c, [s for s in scores if s.cls == c])
    return out


def _score_log(job) -> tuple[list[BarScore], int, list[str]]:
    """score_text on one log (a worker process's job)."""
    path, sp, table = job
    return score_text(path, sp, (ROOT / path).read_bytes().decode("utf-8", errors="replace"), table)


def read_listing(path: Path) -> set[str]:
    """The log paths a listing names (bench/corpus/THIRTEENTH.txt: one a line, # comments)."""
    return {ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


OUTSIDE = "outside"  # the split name of a corpus kept outside the repository (--corpus)


def committed_digests() -> set[str]:
    """sha256 of every log this repository holds: the corpus and the parser's fixtures."""
    dirs = (ROOT / "bench" / "corpus", ROOT / "tests" / "fixtures" / "logs")
    return {hashlib.sha256(p.read_bytes()).hexdigest() for d in dirs for p in d.rglob("*.log")}


def outside_logs(corpus: Path, names: list[str] | None = None) -> tuple[list[Path], list[Path]]:
    """(the logs of a corpus kept outside the repository, those of them left out because the
    repository holds the same bytes). names: the paths its LABELS.tsv lists (relative to corpus, or
    joined to it already); else every *.log under it."""
    if not corpus.is_dir():
        raise SystemExit(f"--corpus {corpus}: no such directory (a folder of *.log files kept outside this "
                         f"repository, e.g. ../shared/corpus, with a LABELS.tsv for the reasons bench)")
    paths = [corpus / n for n in names] if names is not None else sorted(corpus.rglob("*.log"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(f"--corpus {corpus}: LABELS.tsv names files that are not there: {', '.join(missing[:5])}")
    seen = committed_digests()
    fresh, known = [], []
    for p in paths:
        (known if hashlib.sha256(p.read_bytes()).hexdigest() in seen else fresh).append(p)
    return fresh, known


def per_bar_line(s: BarScore) -> str:
    """One bar's figures, as `--per-bar` prints them (bench/eta_compare.py reads two such listings)."""
    return (f"    {s.cls:14s} {'C' if s.complete else ' '} {s.name[-80:]:80s} n={s.obs:4d} "
            + " ".join(f"{m} {statistics.median(s.errs[m]):.3f}" for m in METHODS)
            + f" cov {s.covered / s.obs:.0%}")


def run(split: str = "holdout", synthetic: bool = False, per_bar: bool = False,
        paths: list[str] | None = None, apart: Path | None = None, jobs: int = 1,
        corpus: Path | None = None) -> dict:
    split_logs = load_split()  # the tuning part gives the prior column, whatever is scored
    logs = split_logs
    if corpus is not None:  # scored as one held-out part
        fresh, known = outside_logs(corpus)
        if known:
            print(f"left out, the repository holds the same bytes (not unseen): {', '.join(map(str, known))}")
        split = OUTSIDE
        logs = [(str(p), "", OUTSIDE) for p in fresh]
    # every log is replayed on its own: worker processes give the same figures, in the same order
    pool = multiprocessing.Pool(jobs) if jobs > 1 else None
    try:
        table = build_priors(split_logs, pool)
        todo = [(path, sp, table) for path, _src, sp in logs
                if (split == "all" or sp == split) and (paths is None or path in paths)]
        results = (pool.imap if pool else map)(_score_log, todo)
        scores: list[BarScore] = []
        unscored = 0
        left_out: list[str] = []
        for got, un, mixed in results:
            scores += got
            unscored += un
            left_out += mixed
    finally:
        if pool:
            pool.close()
    n_logs = sum(1 for p, _s, sp in logs if (split == "all" or sp == split) and (paths is None or p in paths))
    print(f"split {split}: {n_logs} logs, {len(scores)} bars scored ({unscored} bars with no frame 2 s or more "
          f"before their last count)")
    if left_out:
        print(f"  left out, concurrent bars interleaved in one stream (a key restarting part way "
              f"{INTERLEAVED_STARTS}+ times): " + "; ".join(left_out))
    lanes = [s for s in scores if s.lane]
    scores = [s for s in scores if not s.lane]
    out = report_all(f"[{split}] median over bars of the median relative error; ours' ratio to each", scores)
    if lanes:
        n_lane_logs = len({s.name.split(":", 1)[0] for s in lanes})
        out["lanes"] = report_all(f"[{split}, apart: concurrent bars after the first of their key, {len(lanes)} bars "
                                  f"of {n_lane_logs} logs] the same figures", lanes)
    if apart is not None:  # e.g. the logs new in a round: the only figures on bars nobody here had scored
        listed = read_listing(apart)
        sub = [s for s in scores if s.name.split(":", 1)[0] in listed]
        n_apart = sum(1 for p, _s, sp in logs if p in listed and (split == "all" or sp == split))
        out["apart"] = report_all(f"[{split}, apart: the {n_apart} logs of {apart.name}] the same figures", sub)
    if per_bar:
        for s in scores + lanes:
            print(per_bar_line(s))
    if synthetic:
        syn: list[BarScore] = []
        for name, text in synthetic_logs().items():
            syn += score_text(name, "synthetic", text, None)[0]
        out["synthetic"] = report_all("[SYNTHETIC, not real logs]", syn)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=["holdout", "tuning", "all"], default="holdout")
    ap.add_argument("--per-bar", action="store_true", help="print every bar's figures")
    ap.add_argument("--synthetic", action="store_true", help="also the synthetic scenarios (reported apart)")
    ap.add_argument("--apart", type=Path, metavar="LIST",
                    help="also report the logs listed in LIST apart (one path a line; bench/corpus/THIRTEENTH.txt, "
                         "ELEVENTH.txt: a round's new logs)")
    ap.add_argument("--corpus", type=Path, metavar="DIR",
                    help="score the logs under DIR instead: a corpus kept outside this repository, never tuned on")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                    help="worker processes (each log is replayed on its own; the figures do not depend on it)")
    ap.add_argument("--only", type=Path, metavar="LIST",
                    help="score only the split's logs listed in LIST (one path a line): a quick look at the "
                         "bars a change can touch; the prior column still comes from the whole tuning part")
    args = ap.parse_args()
    paths = sorted(read_listing(args.only)) if args.only else None
    if paths is not None:
        in_split = {p for p, _s, sp in load_split() if args.split == "all" or sp == args.split}
        if stray := [p for p in paths if p not in in_split]:
            ap.error(f"{args.only}: not logs of the {args.split} part (bench/corpus/SPLIT.tsv): {', '.join(stray)}")
    run(args.split, args.synthetic, args.per_bar, paths=paths, apart=args.apart, jobs=args.jobs, corpus=args.corpus)


if __name__ == "__main__":
    main()
