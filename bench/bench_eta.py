"""ETA accuracy on real logs, beside tqdm's own printed ETA on the same observations.

    /work/main/.venv/bin/python bench/bench_eta.py [--group real|recorded|synthetic] [--per-bar]

Corpus (bench/corpus/, sources in bench/corpus/SOURCES.md):
  real/       progress lines pasted in public GitHub issues (vLLM / SGLang weight loads, vLLM
              offline inference, Lightning training), plus the parser's fixture logs
              (tests/fixtures/logs/public, sources in tests/fixtures/logs/SOURCES.md);
  recorded/   real runs recorded here (bench/record_runs.py: CPU training, tokenizing), on an H200
              (bench/record_runs_gpu.py), the demo pipeline's own runs; plus
              tests/fixtures/logs/recorded (vLLM CPU server start, speculators' trainer, h200/);
  synthetic   (made here, reported apart, never mixed in): per-item times drawn from scenarios
              (drift like the seeds' load, a 100x slow first item, a collapse, evaluation pauses)
              and printed by tqdm itself (tqdm's format_meter and EMA on a simulated clock).

Every log goes through the same replay as `lab eta replay` (eaglelab.eta.replay), and each frame's
own eta_s / eta_low_s / eta_high_s is scored. Only bars that reach their total in the file are
scored: the truth at a frame is the time from it to the first frame at total. A pasted excerpt
that stops mid-bar has no known end: it is counted and left out. Frames with under 2 s left are
skipped (whole-second clocks).
Figures: the median over bars of the median relative error |eta - truth| / truth per bar (ours,
tqdm printed, tqdm EMA replayed), their ratio, the same with an error within one clock tick
counted as none (the truth is a difference of whole seconds, and tqdm prints its remaining time
truncated), and the share of observations whose truth lies in [eta_low_s, eta_high_s]. Every
group is also split into halves A / B by the log's name (half_of: fixed before any figure was
seen; B is held out), and all real logs (public + recorded) are summarized together.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from eaglelab.eta.replay import replay

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
    ours_tol: list = field(default_factory=list)
    tqdm_tol: list = field(default_factory=list)
    half: str = ""


def bars_of(lines):
    """{(key, instance): [ReplayRow...]} in file order."""
    out: dict = {}
    for row in replay(lines):
        out.setdefault((row.key, row.instance), []).append(row)
    return out


def half_of(name: str) -> str:
    """A fixed split of the logs, chosen before any figure was seen: "A" (the half the estimator's
    constants may be looked at on) or "B" (held out), by the first byte of sha256 of the log's name."""
    return "A" if hashlib.sha256(name.encode()).digest()[0] % 2 == 0 else "B"


def score_bar(name: str, rows) -> tuple[BarScore | None, bool]:
    """(score, complete) for one bar: only a bar that reaches its total in the log is scored (the
    truth needs the end time); the estimate scored is the replay's own eta_s/eta_low_s/eta_high_s."""
    rows = [r for r in rows if r.elapsed_s is not None]
    if len(rows) < 2:
        return None, False
    total = rows[-1].total
    if total is None or rows[-1].n < total:
        return None, False  # an excerpt that stops mid-bar: its end is not in the log
    t_end = next(r.elapsed_s for r in rows if r.n >= total)
    score = BarScore(name, "complete")
    for r in rows:
        if r.n >= total:
            break
        truth = t_end - r.elapsed_s
        if truth < MIN_TRUTH_S or r.tqdm_eta_s is None or r.eta_s is None or r.ema_eta_s is None:
            continue
        # Both clocks are whole seconds (elapsed, and tqdm's printed remaining): the truth is known
        # to +-1 tick; the tolerant figure counts an error within one tick as none, for everybody.
        tick = r.resolution
        score.obs += 1
        for errs, tol, est in ((score.ours, score.ours_tol, r.eta_s), (score.tqdm, score.tqdm_tol, r.tqdm_eta_s),
                               (score.ema, None, r.ema_eta_s)):
            errs.append(abs(est - truth) / truth)
            if tol is not None:
                tol.append(max(abs(est - truth) - tick, 0.0) / truth)
        score.covered += r.eta_low_s <= truth <= r.eta_high_s
    return (score if score.obs else None), True


def score_log(name: str, text: str, counts: dict) -> list[BarScore]:
    out = []
    for (key, inst), rows in bars_of(text.split("\n")).items():
        s, complete = score_bar(f"{name}:{key[1] or '(bar)'}#{inst}", rows)
        counts["complete" if complete else "excerpt"] += 1
        if s is not None:
            s.half = half_of(name)
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
    noise = lambda k, s=0.15: rng.lognormal(0.0, s, k)
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


def summarize(label: str, scores: list[BarScore], counts: dict | None = None) -> dict:
    if not scores:
        print(f"{label}: no complete bar with an observation to score")
        return {}
    med = lambda xs: statistics.median(xs)
    fig = {k: med([med(getattr(s, k)) for s in scores]) for k in ("ours", "tqdm", "ema", "ours_tol", "tqdm_tol")}
    obs = sum(s.obs for s in scores)
    fig["coverage"] = sum(s.covered for s in scores) / obs
    ratio = lambda a, b: a / b if b else float("nan")
    extra = (f"; {counts['excerpt']} excerpt bars that stop mid-bar not scored (no end time), "
             f"{counts['complete'] - len(scores)} complete bars with no observation 2 s or more from the end"
             if counts else "")
    print(f"{label}: {len(scores)} complete bars scored, {obs} observations{extra}")
    print(f"  median rel. error  ours {fig['ours']:.3f}   tqdm printed {fig['tqdm']:.3f}   tqdm EMA replayed "
          f"{fig['ema']:.3f}   ratio ours/tqdm {ratio(fig['ours'], fig['tqdm']):.2f}")
    print(f"  errors within one clock tick counted as 0: ours {fig['ours_tol']:.3f}   tqdm printed "
          f"{fig['tqdm_tol']:.3f}   ratio {ratio(fig['ours_tol'], fig['tqdm_tol']):.2f}")
    print(f"  coverage of [eta_low_s, eta_high_s]: {fig['coverage']:.1%}")
    return fig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group", choices=["real", "recorded", "synthetic"], action="append")
    ap.add_argument("--per-bar", action="store_true", help="print every bar's figures")
    args = ap.parse_args()
    groups = args.group or ["real", "recorded", "synthetic"]
    every_real: list[BarScore] = []  # public pastes and runs recorded here: the goal is on these
    for group in groups:
        scores: list[BarScore] = []
        counts = {"complete": 0, "excerpt": 0}
        if group == "synthetic":
            for name, text in synthetic_logs().items():
                scores += score_log(name, text, counts)
        else:
            paths = sorted((CORPUS / group).glob("*.log")) + sorted(
                p for p in (PARSER_FIXTURES / PARSER_DIRS[group]).rglob("*.log") if p.name not in DUPLICATES)
            for path in paths:
                text = path.read_bytes().decode("utf-8", errors="replace")
                scores += score_log(path.stem, text, counts)
        if group != "synthetic":
            every_real += scores
        tag = f"{group}{' (SYNTHETIC)' if group == 'synthetic' else ''}"
        summarize(f"[{tag}]", scores, counts)
        if group != "synthetic":
            for half in ("A", "B"):
                summarize(f"  [{tag}, half {half}{' (held out)' if half == 'B' else ''}]",
                          [s for s in scores if s.half == half])
        if args.per_bar:
            for s in scores:
                print(f"    {s.half} {s.name:70s} n={s.obs:4d} ours {statistics.median(s.ours):.3f} "
                      f"tqdm {statistics.median(s.tqdm):.3f} ema {statistics.median(s.ema):.3f} "
                      f"tol: ours {statistics.median(s.ours_tol):.3f} tqdm {statistics.median(s.tqdm_tol):.3f} "
                      f"cov {s.covered / s.obs:.0%}")
    if "real" in groups and "recorded" in groups:
        summarize("[all real logs: public + recorded]", every_real)
        for half in ("A", "B"):
            summarize(f"  [all real, half {half}{' (held out)' if half == 'B' else ''}]",
                      [s for s in every_real if s.half == half])


if __name__ == "__main__":
    main()
