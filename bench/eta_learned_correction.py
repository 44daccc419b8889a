"""Can a correction learned from the tuning logs beat the ETA estimator? Cross-validated by source.

    .venv/bin/python bench/eta_learned_correction.py [--features NAME,NAME ...]

The bars of the "rate change" class end sooner than any rate carried forward says (the last shard is
smaller, a batch drains): ours and tqdm both over-predict them. A model fitted on the tuning part
could learn that, or could learn one repository's habits. This scores the question honestly: a
median (least absolute deviation) regression of log(truth / ours) on what is known at each frame,
every bar weighing the same, fitted with one source left out and scored on that source, for every
source of the tuning part (leave-one-source-out). The held-out part is not read.

Features (each known when the estimate is made):
  horizon    log of our estimate (seconds)
  items      log of the items left
  done       the share of the bar done
  vs_tqdm    log(tqdm's remaining / ours)
  vs_ema     log(tqdm's EMA replayed / ours)
  shards     the bar's label names shards
  elapsed    log(elapsed / our estimate)
  last       1 / items left (the last item's weight)
Figures: the median over bars of each bar's median relative error, as bench_eta.py scores, for ours,
ours corrected (each bar's correction fitted without its source) and tqdm; and how many bars the
correction made better and worse.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_eta

FEATURES = ("horizon", "items", "done", "vs_tqdm", "vs_ema", "shards", "elapsed", "last")
ONE_JOB = "persona-moderation-qwenvl7-12"  # one job's 11 batches: reported with and without


def frames(split: str = "tuning") -> list[dict]:
    """Every scored frame of the split, as bench_eta scores it, with what was known then."""
    out = []
    for path, src, sp in bench_eta.load_split():
        if sp != split:
            continue
        text = (ROOT / path).read_bytes().decode("utf-8", errors="replace")
        for (key, inst), rows in bench_eta.scored_bars(text)[0].items():
            rows = [r for r in rows if r.elapsed_s is not None]
            for _i, r, truth, total in bench_eta.scored_frames(rows):
                if not r.eta_s:  # a zero estimate has no log ratio to correct
                    continue
                ema = r.ema_eta_s if r.ema_eta_s else None
                tqdm = r.tqdm_eta_s if r.tqdm_eta_s is not None else ema
                out.append({"bar": f"{path}:{key[1] or '(bar)'}#{inst}", "src": src, "label": key[1] or "",
                            "n": r.n, "total": total, "t": r.elapsed_s, "truth": truth, "ours": r.eta_s,
                            "tqdm": tqdm, "ema": ema})
    return out


def features(f: dict) -> dict[str, float]:
    ours = f["ours"]
    left = f["total"] - f["n"]
    tqdm = f["tqdm"] if f["tqdm"] and f["tqdm"] > 0 else ours
    ema = f["ema"] if f["ema"] and f["ema"] > 0 else ours
    return {"horizon": math.log(ours), "items": math.log(left), "done": f["n"] / f["total"],
            "vs_tqdm": math.log(tqdm / ours), "vs_ema": math.log(ema / ours),
            "shards": 1.0 if re.search("shard", f["label"], re.I) else 0.0,
            "elapsed": math.log(max(f["t"], 1.0) / ours), "last": 1.0 / left}


def lad(x: np.ndarray, y: np.ndarray, w: np.ndarray, ridge: float = 1.0, rounds: int = 60) -> np.ndarray:
    """Weighted least absolute deviation by iteratively reweighted least squares (the intercept,
    column 0, is not shrunk)."""
    beta = np.zeros(x.shape[1])
    shrink = ridge * np.diag(np.r_[0.0, np.ones(x.shape[1] - 1)])
    for _ in range(rounds):
        ww = w / np.maximum(np.abs(y - x @ beta), 1e-3)
        beta = np.linalg.solve(x.T @ (x * ww[:, None]) + shrink, x.T @ (ww * y))
    return beta


def per_bar(rows: list[dict], estimate) -> dict[str, float]:
    errs: dict[str, list[float]] = {}
    for f in rows:
        errs.setdefault(f["bar"], []).append(abs(estimate(f) - f["truth"]) / f["truth"])
    return {b: statistics.median(v) for b, v in errs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--features", default=",".join(FEATURES), help=f"comma-separated, of {', '.join(FEATURES)}")
    names = [n for n in ap.parse_args().features.split(",") if n]
    rows = frames()
    x = np.array([[1.0] + [features(f)[n] for n in names] for f in rows])
    y = np.array([math.log(f["truth"] / f["ours"]) for f in rows])
    bars = [f["bar"] for f in rows]
    count = {b: bars.count(b) for b in set(bars)}
    w = np.array([1.0 / count[b] for b in bars])  # every bar weighs the same, as the bench's median over bars
    srcs = np.array([f["src"] for f in rows])
    correction = np.zeros(len(rows))
    for src in sorted(set(srcs)):
        held = srcs == src
        correction[held] = x[held] @ lad(x[~held], y[~held], w[~held])
    for f, c in zip(rows, correction):
        f["corrected"] = f["ours"] * math.exp(c)
    ours, corrected = per_bar(rows, lambda f: f["ours"]), per_bar(rows, lambda f: f["corrected"])
    tqdm = per_bar([f for f in rows if f["tqdm"]], lambda f: f["tqdm"])
    fit_all = lad(x, y, w)
    print(f"tuning part: {len(rows)} frames, {len(ours)} bars, {len(set(srcs))} sources; features: {', '.join(names)}")
    print("coefficients fitted on every source: " + ", ".join(f"{n} {b:+.3f}" for n, b in zip(["1"] + names, fit_all)))
    for title, keep in (("all bars", lambda b: True), (f"without {ONE_JOB}", lambda b: ONE_JOB not in b)):
        med = [statistics.median([v for b, v in d.items() if keep(b)]) for d in (ours, corrected, tqdm)]
        print(f"  {title:42s} ours {med[0]:.3f}  corrected (leave one source out) {med[1]:.3f}  tqdm {med[2]:.3f}")
    better = sum(corrected[b] < ours[b] - 1e-9 for b in ours)
    worse = sum(corrected[b] > ours[b] + 1e-9 for b in ours)
    print(f"  the correction made {better} bars better and {worse} worse")


if __name__ == "__main__":
    main()
