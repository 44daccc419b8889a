"""Two ETA bench listings side by side, bar by bar: what a change to the estimator moved.

    .venv/bin/python bench/bench_eta.py --split tuning --per-bar > before.txt   # the code before
    .venv/bin/python bench/bench_eta.py --split tuning --per-bar > after.txt    # the change
    .venv/bin/python bench/eta_compare.py before.txt after.txt [--moves 8]

Reads the per-bar lines of two `--per-bar` runs (bench_eta.per_bar_line), pairs the bars by name and
prints, for all bars, each class and the checkpoint-shard loads: the median of ours before and after,
tqdm's beside them, how many bars got better and how many worse, and the mean coverage by bar; then
the bars that moved most each way. A change is judged on the tuning part; the held-out part is read
once, after (docs/eta.md).
"""

from __future__ import annotations

import argparse
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

# bench_eta.per_bar_line: class, C for a complete bar, name, n=obs, then each method's median error
BAR_LINE = re.compile(r"^ {4}(?P<cls>\S.{13})\s(?P<complete>[C ])\s(?P<name>.+?)\s+n=\s*(?P<obs>\d+)"
                      r"(?P<methods>(?: [a-z]+ [\d.]+)+) cov (?P<cov>\d+)%$")


@dataclass(frozen=True)
class Bar:
    cls: str
    complete: bool
    obs: int
    errs: dict
    cov: float


def read_bars(path: Path) -> dict[str, Bar]:
    """{bar name: its figures} of one listing; a name seen twice (names are cut to their last 80
    characters) keeps its first line, and the second is not read."""
    bars: dict[str, Bar] = {}
    for line in path.read_text(errors="replace").splitlines():
        m = BAR_LINE.match(line)
        if not m:
            continue
        vals = m["methods"].split()
        errs = {k: float(v) for k, v in zip(vals[::2], vals[1::2])}
        bars.setdefault(m["name"].strip(), Bar(m["cls"].strip(), m["complete"] == "C", int(m["obs"]), errs,
                                               float(m["cov"])))
    return bars


def group_row(name: str, keys: list[str], before: dict[str, Bar], after: dict[str, Bar]) -> str:
    a = statistics.median(before[k].errs["ours"] for k in keys)
    b = statistics.median(after[k].errs["ours"] for k in keys)
    tqdm = statistics.median(before[k].errs["tqdm"] for k in keys)
    better = sum(after[k].errs["ours"] < before[k].errs["ours"] for k in keys)
    worse = sum(after[k].errs["ours"] > before[k].errs["ours"] for k in keys)
    cov_a = statistics.fmean(before[k].cov for k in keys)
    cov_b = statistics.fmean(after[k].cov for k in keys)
    of = (lambda x: f"{x / tqdm:.2f}") if tqdm > 0 else (lambda x: "-")
    return (f"{name:16s} {len(keys):5d} bars | ours {a:.3f} -> {b:.3f} (of tqdm {of(a)} -> {of(b)}) | "
            f"better {better}, worse {worse} | coverage by bar {cov_a:.1f}% -> {cov_b:.1f}%")


def compare(before: dict[str, Bar], after: dict[str, Bar], moves: int = 8) -> list[str]:
    keys = [k for k in before if k in after]
    if not keys:
        raise SystemExit("no bar is in both listings: were both made with --per-bar, on the same part?")
    out = [f"{len(keys)} bars in both listings ({len(before) - len(keys)} only before, {len(after) - len(keys)} only after)"]
    out.append(group_row("all bars", keys, before, after))
    for cls in sorted({before[k].cls for k in keys}):
        out.append(group_row(cls, [k for k in keys if before[k].cls == cls], before, after))
    shards = [k for k in keys if "shard" in k.lower()]
    if shards:
        out.append(group_row("shard loads", shards, before, after))
    moved = sorted((k for k in keys if after[k].errs["ours"] != before[k].errs["ours"]),
                   key=lambda k: after[k].errs["ours"] - before[k].errs["ours"])
    better = [k for k in moved if after[k].errs["ours"] < before[k].errs["ours"]][:moves]
    worse = [k for k in reversed(moved) if after[k].errs["ours"] > before[k].errs["ours"]][:moves]
    for title, part in (("most better", better), ("most worse", worse)):
        if part:
            out.append(f"{title}:")
            out += [f"  {before[k].errs['ours']:.3f} -> {after[k].errs['ours']:.3f} (tqdm {before[k].errs['tqdm']:.3f}) {k}"
                    for k in part]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--moves", type=int, default=8, help="how many of the bars that moved most to name, each way")
    args = ap.parse_args()
    before, after = read_bars(args.before), read_bars(args.after)
    for path, bars in ((args.before, before), (args.after, after)):
        if not bars:
            raise SystemExit(f"{path}: no per-bar line (make it with bench/bench_eta.py --per-bar)")
    print("\n".join(compare(before, after, args.moves)))


if __name__ == "__main__":
    main()
