"""The honest evaluation: parser and ETA on public logs, held-out split only, baselines in the same run.

    /work/main/.venv/bin/python bench/bench_holdout.py [--split holdout|tuning] [--misses]
    /work/main/.venv/bin/python bench/bench_holdout.py --corpus DIR   (make bench-outside CORPUS=DIR)
    (make bench-holdout)

--corpus DIR reads a corpus kept outside this repository instead (never tuned on or committed here):
its LABELS.tsv, in bench/corpus/LABELS.tsv's columns with paths relative to DIR, gives the parse figures; without
one only the ETA is scored, on every *.log under DIR. Logs the repository already holds byte for byte
are left out and named (bench_eta.outside_logs).

Corpus: every log listed in bench/corpus/LABELS.tsv (public GitHub issues and pull requests, the
source URL of each in the file; labels read by a person: failed or not, the failure reason, the
last bar's n/total). The split is by source repository, fixed before any figure was looked at:
a repository's logs are all held out when the first byte of sha256("eaglelab-holdout/" + repo) is
below 128 (SPLIT_SALT and the rule never change; tuning looks only at --split tuning). The split is
written down in bench/corpus/SPLIT.tsv (shared with bench/bench_eta.py), which this reads.

Parse accuracy (`lab parse`'s whole-file reading, eaglelab.host.tail.whole.parse_file):
  failed detected   failed logs the parser calls failed
  right reason      failed logs with the labelled reason
  false alarms      logs that did not fail but are called failed
  progress right    logs with a bar whose last n/total the parser reports
ETA (`lab eta replay`'s rows, eaglelab.eta.replay): public pastes rarely hold a whole bar, so every
bar is scored up to the last count the log shows (its total where it gets there): the replay runs
a second time with that count as the bar's horizon, the truth at a frame is the time from it to
the first frame at that count, and frames under 2 s from it are skipped. Median over bars of each
bar's median relative error |eta - truth| / truth for
  ours              eta_s of the replay (the estimator the tailer, lab status and the page use)
  tqdm              the remaining time the frame printed (scaled to the horizon: tqdm's is items
                    left / its smoothed rate)
  mean rate         elapsed / n x items left (the whole history's mean rate)
  recent slope      the rate over the last RECENT observations (at least 2 clock ticks)
and the share of observations whose truth lies in [eta_low_s, eta_high_s].
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import math
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from bench_eta import interleaved_keys, outside_logs, read_listing

from eaglelab.eta.replay import replay
from eaglelab.host.tail.whole import parse_file

LABELS = ROOT / "bench" / "corpus" / "LABELS.tsv"
SPLIT_SALT = "eaglelab-holdout/"
MIN_TRUTH_S = 2.0
RECENT = 5


def split_of(repo: str) -> str:
    """"holdout" or "tuning" for a source repository (fixed; see the module's docstring)."""
    return "holdout" if hashlib.sha256((SPLIT_SALT + repo).encode()).digest()[0] < 128 else "tuning"


SPLIT = ROOT / "bench" / "corpus" / "SPLIT.tsv"


def split_table() -> dict[str, str]:
    """{path: split} as written in bench/corpus/SPLIT.tsv (the one record of the split, by source)."""
    rows = [r for r in SPLIT.read_text().splitlines() if r and not r.startswith("#")]
    return {r["path"]: r["split"] for r in csv.DictReader(rows, delimiter="\t")}


@dataclass
class Label:
    path: str
    repo: str
    url: str
    failed: bool
    reason: str | None
    progress: str | None


def load_labels(path: Path = LABELS, base: Path | None = None) -> list[Label]:
    """The labelled logs of path (LABELS.tsv's columns); base: the folder the paths are relative to,
    for a corpus outside the repository (the paths come back joined to it)."""
    rows = [r for r in path.read_text().splitlines() if r and not r.startswith("#")]
    out = []
    for r in csv.DictReader(rows, delimiter="\t"):
        out.append(Label(str(base / r["path"]) if base else r["path"], r["repo"], r["url"], r["failed"] == "1",
                         None if r["reason"] == "-" else r["reason"],
                         None if r["progress"] == "-" else r["progress"]))
    return out


# --- parse accuracy -----------------------------------------------------------------------------

_SCALE = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _amounts(text: str) -> set[float]:
    """A label's count as a number, raw and scaled by its k/M/G suffix ("4.70G" -> {4.7, 4.7e9})."""
    m = re.fullmatch(r"([0-9.]+)\s*([kKMGT]?)", text.strip())
    if m is None:
        return set()
    v = float(m.group(1))
    return {v, v * _SCALE.get(m.group(2), 1.0)}


def progress_matches(label: str, progress: dict | None) -> bool:
    if progress is None:
        return False
    n_txt, total_txt = label.split("/")
    n_ok = any(math.isclose(progress["n"], v, rel_tol=1e-3) for v in _amounts(n_txt))
    if total_txt == "-":
        return n_ok and progress.get("total") is None
    total = progress.get("total")
    return n_ok and total is not None and any(math.isclose(total, v, rel_tol=1e-3) for v in _amounts(total_txt))


@dataclass
class ParseScore:
    failed: int = 0
    detected: int = 0
    right_reason: int = 0
    not_failed: int = 0
    false_alarms: int = 0
    with_bar: int = 0
    progress_right: int = 0
    misses: list = field(default_factory=list)


def score_parse(labels: list[Label]) -> ParseScore:
    s = ParseScore()
    for lab in labels:
        state = parse_file(ROOT / lab.path)
        got_failed = state["state"] == "failed"
        reason = (state.get("failure") or {}).get("reason")
        if lab.failed:
            s.failed += 1
            s.detected += got_failed
            s.right_reason += got_failed and reason == lab.reason
            if not (got_failed and reason == lab.reason):
                s.misses.append(f"{lab.path}: want failed/{lab.reason}, got {state['state']}/{reason}")
        else:
            s.not_failed += 1
            s.false_alarms += got_failed
            if got_failed:
                s.misses.append(f"{lab.path}: want not failed, got failed/{reason}")
        if lab.progress:
            s.with_bar += 1
            ok = progress_matches(lab.progress, state.get("progress"))
            s.progress_right += ok
            if not ok:
                p = state.get("progress")
                s.misses.append(f"{lab.path}: want progress {lab.progress}, got "
                                f"{p and (p['n'], p['total'])}")
    return s


# --- ETA ----------------------------------------------------------------------------------------

METHODS = ("ours", "tqdm", "mean", "slope")


@dataclass
class BarScore:
    name: str
    errs: dict = field(default_factory=lambda: {m: [] for m in METHODS})
    covered: int = 0

    @property
    def obs(self) -> int:
        return len(self.errs["ours"])


def _mean_rate_eta(row) -> float | None:
    if not row.elapsed_clock or row.n <= 0 or row.total is None:
        return None  # the bar's own elapsed is the whole history's clock; a line timestamp is not
    return row.elapsed_s / row.n * (row.total - row.n)


def _slope_eta(history: list, row) -> float | None:
    pts = [(r.elapsed_s, r.n) for r in history[-RECENT:]]
    (t0, n0), (t1, n1) = pts[0], pts[-1]
    if row.total is None or n1 <= n0 or t1 - t0 < 2 * row.resolution:
        return None
    return (t1 - t0) / (n1 - n0) * (row.total - row.n)


def score_bar(name: str, rows) -> BarScore | None:
    rows = [r for r in rows if r.elapsed_s is not None]
    if len(rows) < 2 or rows[-1].total is None or rows[-1].n < rows[-1].total:
        return None  # (the replay gave every bar its last count as the horizon)
    total = rows[-1].total
    t_end = next(r.elapsed_s for r in rows if r.n >= total)
    score = BarScore(name)
    for i, r in enumerate(rows):
        if r.n >= total:
            break
        truth = t_end - r.elapsed_s
        ests = {"ours": r.eta_s, "tqdm": r.tqdm_eta_s, "mean": _mean_rate_eta(r), "slope": _slope_eta(rows[: i + 1], r)}
        if truth < MIN_TRUTH_S or any(v is None for v in ests.values()):
            continue  # the same observations for every method
        for m, v in ests.items():
            score.errs[m].append(abs(v - truth) / truth)
        score.covered += r.eta_low_s <= truth <= r.eta_high_s
    return score if score.obs else None


def score_eta(labels: list[Label]) -> tuple[list[BarScore], int]:
    scores, excerpts = [], 0
    for lab in labels:
        lines = (ROOT / lab.path).read_text(errors="replace").split("\n")
        last: dict = {}
        for row in replay(lines, estimate=False):  # where each bar's log ends: counts only
            if row.elapsed_s is not None:
                last[(row.key, row.instance)] = row.n
        bars: dict = {}
        for row in replay(lines, horizons=last):
            bars.setdefault((row.key, row.instance), []).append(row)
        mixed = interleaved_keys(bars)  # concurrent bars read as one, restarting: bench_eta leaves them out too
        for (key, inst), rows in bars.items():
            if key in mixed or rows[0].lane:  # and a concurrent lane after the first, like bench_eta
                continue
            s = score_bar(f"{lab.path}:{key[1] or '(bar)'}#{inst}", rows)
            if s is None:
                excerpts += 1
            else:
                scores.append(s)
    return scores, excerpts


def score_apart(labels: list[Label], listing: Path) -> tuple[list[Label], ParseScore]:
    """The labels of the logs listed in listing (one path a line, # comments) and their parse score."""
    listed = read_listing(listing)
    mine = [lab for lab in labels if lab.path in listed]
    return mine, score_parse(mine)


def outside_labels(corpus: Path) -> tuple[list[Label], bool, list[Path]]:
    """(the logs of a corpus kept outside the repository, whether a person labelled them, those left
    out because the repository holds the same bytes)."""
    labels_file = corpus / "LABELS.tsv"
    if labels_file.is_file():
        labelled = load_labels(labels_file, base=corpus)
        fresh, known = outside_logs(corpus, [lab.path for lab in labelled])  # already joined to corpus
        keep = {str(p) for p in fresh}
        return [lab for lab in labelled if lab.path in keep], True, known
    fresh, known = outside_logs(corpus)
    return [Label(str(p), "", "", False, None, None) for p in fresh], False, known


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=["holdout", "tuning"], default="holdout")
    ap.add_argument("--corpus", type=Path, metavar="DIR",
                    help="read a corpus kept outside this repository instead (DIR/LABELS.tsv for the parse figures)")
    ap.add_argument("--misses", action="store_true", help="list every log the parser gets wrong, and every bar")
    ap.add_argument("--apart", type=Path, metavar="LIST",
                    help="also report the parse figures of the logs listed in LIST apart (one path a line, "
                         "# comments; bench/corpus/THIRTEENTH.txt: a round's new logs)")
    args = ap.parse_args()
    labelled = True
    if args.corpus:
        labels, labelled, known = outside_labels(args.corpus)
        if known:
            print(f"left out, the repository holds the same bytes (not unseen): {', '.join(map(str, known))}")
        print(f"corpus {args.corpus} (outside the repository): {len(labels)} logs"
              + ("" if labelled else ", no LABELS.tsv: the ETA only"))
    else:
        table = split_table()
        labels = [lab for lab in load_labels() if table.get(lab.path, split_of(lab.repo)) == args.split]
        repos = {lab.repo for lab in labels}
        print(f"split {args.split}: {len(labels)} logs from {len(repos)} repositories "
              f"({sum(lab.failed for lab in labels)} failed)")

    p = score_parse(labels if labelled else [])
    pct = lambda a, b: f"{a / b:.2f} ({a}/{b})" if b else "n/a"
    if labelled:
        print(f"parse: failed detected {pct(p.detected, p.failed)}   right reason {pct(p.right_reason, p.failed)}   "
              f"false alarms {pct(p.false_alarms, p.not_failed)}   progress right {pct(p.progress_right, p.with_bar)}")
    if args.apart:
        mine, q = score_apart(labels, args.apart)
        print(f"  of them, the {len(mine)} listed in {args.apart}: failed detected {pct(q.detected, q.failed)}   "
              f"right reason {pct(q.right_reason, q.failed)}   false alarms {pct(q.false_alarms, q.not_failed)}   "
              f"progress right {pct(q.progress_right, q.with_bar)}")
        for m in q.misses:
            print("    miss: " + m)

    scores, excerpts = score_eta(labels)
    if not scores:
        print("eta: no complete bar with an observation to score")
    else:
        med = statistics.median
        fig = {m: med([med(s.errs[m]) for s in scores]) for m in METHODS}
        obs = sum(s.obs for s in scores)
        cov = sum(s.covered for s in scores) / obs
        print(f"eta: {len(scores)} bars scored to their last count, {obs} observations ({excerpts} bars with "
              f"no observation 2 s or more before it)")
        print(f"  median of per-bar median relative error: ours {fig['ours']:.3f}   tqdm printed {fig['tqdm']:.3f}   "
              f"mean rate {fig['mean']:.3f}   recent slope {fig['slope']:.3f}")
        best = min(fig["mean"], fig["slope"])
        ratio = lambda a, b: a / b if b else float("nan")
        print(f"  ours / tqdm {ratio(fig['ours'], fig['tqdm']):.2f}   ours / best simple baseline "
              f"{ratio(fig['ours'], best):.2f}   "
              f"range coverage {cov:.1%}")
        if args.misses:
            for s in scores:
                print(f"    {s.name}: obs {s.obs}  " + "  ".join(f"{m} {med(s.errs[m]):.3f}" for m in METHODS)
                      + f"  covered {s.covered}/{s.obs}")
    if args.misses:
        print("parse misses:")
        for m in p.misses:
            print("  " + m)


if __name__ == "__main__":
    main()
