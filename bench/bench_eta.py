"""ETA accuracy on real logs, beside tqdm's own printed ETA on the same observations.

    /work/main/.venv/bin/python bench/bench_eta.py [--group real|recorded|synthetic] [--per-bar]

Corpus (bench/corpus/, sources in bench/corpus/SOURCES.md):
  real/       progress lines pasted in public GitHub issues (vLLM / SGLang weight loads, vLLM
              offline inference, Lightning training), plus the parser's fixture logs
              (tests/fixtures/logs/public, sources in tests/fixtures/logs/SOURCES.md);
  recorded/   real runs recorded on this machine (bench/record_runs.py): CPU training, tokenizing;
              plus tests/fixtures/logs/recorded (a vLLM CPU server start, speculators' trainer);
  synthetic   (made here, reported apart, never mixed in): per-item times drawn from scenarios
              (drift like the seeds' load, a 100x slow first item, a collapse, evaluation pauses)
              and printed by tqdm itself (tqdm's format_meter and EMA on a simulated clock).

Every log goes through the same replay as `lab eta replay` (eaglelab.eta_replay). For each bar:
  - if it reaches its total in the file, the truth at an observation is the time from it to the
    first frame at total ("complete" bars);
  - pasted excerpts mostly stop mid-bar: then the target is the last count the excerpt shows and
    every estimate (ours, tqdm's printed one, tqdm's EMA) is for reaching that count; tqdm's printed
    remaining time is rescaled by its own rate: remaining * (target - n) / (total - n)
    ("truncated" bars).
Figures: the median over bars of the median relative error |eta - truth| / truth per bar (ours,
tqdm printed, tqdm EMA replayed), their ratio, and the share of observations whose truth lies in
[eta_low_s, eta_high_s]. Observations whose truth is under 2 s (whole-second clocks) are left out.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from eaglelab.eta import TqdmEma, estimate_bar  # noqa: E402
from eaglelab.eta_replay import replay  # noqa: E402

CORPUS = ROOT / "bench" / "corpus"
# The parser's fixture logs (real, sources in tests/fixtures/logs/SOURCES.md) count too.
PARSER_FIXTURES = ROOT / "tests" / "fixtures" / "logs"
PARSER_DIRS = {"real": "public", "recorded": "recorded"}
DUPLICATES = {"sglang_dsv3_shards.log"}  # the same paste as real/sglang-7181-163shards.log
MIN_TRUTH_S = 2.0


@dataclass
class BarScore:
    name: str
    kind: str  # complete | truncated
    obs: int = 0
    ours: list = field(default_factory=list)
    tqdm: list = field(default_factory=list)
    ema: list = field(default_factory=list)
    covered: int = 0


def bars_of(lines):
    """{(key, instance): [ReplayRow...]} in file order."""
    out: dict = {}
    for row in replay(lines):
        out.setdefault((row.key, row.instance), []).append(row)
    return out


def score_bar(name: str, rows) -> BarScore | None:
    rows = [r for r in rows if r.elapsed_s is not None]
    if len(rows) < 2:
        return None
    total = rows[-1].total
    complete = total is not None and rows[-1].n >= total
    target = total if complete else rows[-1].n
    t_target = next(r.elapsed_s for r in rows if r.n >= target)
    score = BarScore(name, "complete" if complete else "truncated")
    points: list[tuple[float, float]] = []
    if rows[0].elapsed_clock and rows[0].n == 1 and rows[0].elapsed_s > 0:
        points.append((0.0, 0))  # as the replay does: the bar's start, seen
    prior = rows[0].rate_s_per_it if rows[0].n > 1 else None  # a bar seen from its middle
    ema = TqdmEma(start=(0.0, 0) if rows[0].elapsed_clock else None)
    rate_hint = None
    for r in rows:
        points.append((r.elapsed_s, r.n))
        ema.update(r.elapsed_s, r.n)
        rate_hint = r.rate_s_per_it or rate_hint
        if r.n >= target:
            break
        truth = t_target - r.elapsed_s
        if truth < MIN_TRUTH_S or r.tqdm_eta_s is None or r.total is None:
            continue
        est = estimate_bar(points, target, resolution=r.resolution, rate_hint_s_per_item=rate_hint,
                           prior_s_per_item=prior)
        if est is None:
            continue
        scale = (target - r.n) / (r.total - r.n) if r.total > r.n else 1.0
        tq = r.tqdm_eta_s * scale
        em = ema.eta(target, r.n)
        score.obs += 1
        score.ours.append(abs(est.eta_s - truth) / truth)
        score.tqdm.append(abs(tq - truth) / truth)
        score.ema.append(abs(em - truth) / truth if em is not None else math.inf)
        score.covered += est.eta_low_s <= truth <= est.eta_high_s
    return score if score.obs else None


def score_log(name: str, text: str) -> list[BarScore]:
    out = []
    for (key, inst), rows in bars_of(text.split("\n")).items():
        s = score_bar(f"{name}:{key[1] or '(bar)'}#{inst}", rows)
        if s is not None:
            out.append(s)
    return out


# --- synthetic scenarios: per-item times, printed by tqdm itself on a simulated clock ----------


def tqdm_log(per_item: np.ndarray, desc: str, mininterval: float = 0.0) -> str:
    """The log tqdm writes for these per-item times (its own format and EMA), clock simulated."""
    from tqdm import tqdm

    clock = [0.0]
    buf = io.StringIO()
    bar = tqdm(total=len(per_item), desc=desc, file=buf, mininterval=mininterval, miniters=1,
               ascii=True, dynamic_ncols=False, ncols=100)
    bar._time = lambda: clock[0]  # tqdm reads its clock through this attribute
    bar.start_t = bar.last_print_t = 0.0
    for dt in per_item:
        clock[0] += float(dt)
        bar.update(1)
    bar.close()
    return buf.getvalue().replace("\r", "\n")


def synthetic_logs(seed: int = 7) -> dict[str, str]:
    rng = np.random.default_rng(seed)
    noise = lambda k, s=0.15: rng.lognormal(0.0, s, k)  # noqa: E731
    logs = {}
    # The seeds' load: 16 -> 24 -> 27 -> 29 s/shard early, and slower on (45-60 min in all).
    seeds = 16 + 34 * (1 - np.exp(-np.arange(64) / 20.0))
    logs["seeds_like_drift_64"] = tqdm_log(seeds * noise(64, 0.08), "Loading safetensors checkpoint shards")
    logs["slow_first_item_1000"] = tqdm_log(np.r_[60.0, 0.6 * noise(999, 0.4)], "Processed prompts",
                                            mininterval=1.0)
    logs["collapse_mid_200"] = tqdm_log(np.r_[np.full(100, 2.0), np.full(100, 12.0)] * noise(200), "extract")
    pauses = np.full(600, 1.5) * noise(600, 0.2)
    pauses[99::100] += 60.0  # an evaluation every 100 steps
    logs["eval_pauses_600"] = tqdm_log(pauses, "Training", mininterval=1.0)
    logs["constant_noisy_300"] = tqdm_log(3.0 * noise(300, 0.5), "Training")
    logs["speedup_warm_cache_85"] = tqdm_log(np.r_[np.full(20, 25.0), np.full(65, 5.0)] * noise(85), "shards")
    return logs


def summarize(label: str, scores: list[BarScore]) -> dict:
    if not scores:
        print(f"{label}: no bar with an observation to score")
        return {}
    med = lambda xs: statistics.median(xs)  # noqa: E731
    ours = med([med(s.ours) for s in scores])
    tq = med([med(s.tqdm) for s in scores])
    em = med([med(s.ema) for s in scores])
    obs = sum(s.obs for s in scores)
    cov = sum(s.covered for s in scores) / obs
    kinds = {k: sum(1 for s in scores if s.kind == k) for k in ("complete", "truncated")}
    print(f"{label}: {len(scores)} bars ({kinds['complete']} complete, {kinds['truncated']} truncated), "
          f"{obs} observations")
    print(f"  median rel. error  ours {ours:.3f}   tqdm printed {tq:.3f}   tqdm EMA replayed {em:.3f}   "
          f"ratio ours/tqdm {ours / tq if tq else float('nan'):.2f}")
    print(f"  coverage of [eta_low_s, eta_high_s]: {cov:.1%}")
    return {"ours": ours, "tqdm": tq, "ema": em, "coverage": cov}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group", choices=["real", "recorded", "synthetic"], action="append")
    ap.add_argument("--per-bar", action="store_true", help="print every bar's figures")
    args = ap.parse_args()
    groups = args.group or ["real", "recorded", "synthetic"]
    for group in groups:
        scores: list[BarScore] = []
        if group == "synthetic":
            for name, text in synthetic_logs().items():
                scores += score_log(name, text)
        else:
            paths = sorted((CORPUS / group).glob("*.log")) + sorted(
                p for p in (PARSER_FIXTURES / PARSER_DIRS[group]).glob("*.log") if p.name not in DUPLICATES)
            for path in paths:
                text = path.read_bytes().decode("utf-8", errors="replace")
                scores += score_log(path.stem, text)
        summarize(f"[{group}{' (SYNTHETIC)' if group == 'synthetic' else ''}]", scores)
        if args.per_bar:
            for s in scores:
                print(f"    {s.name:70s} {s.kind:9s} n={s.obs:4d} ours {statistics.median(s.ours):.3f} "
                      f"tqdm {statistics.median(s.tqdm):.3f} ema {statistics.median(s.ema):.3f} "
                      f"cov {s.covered / s.obs:.0%}")


if __name__ == "__main__":
    main()
