"""Foresight's lead time and error on a finished demo pipeline (docs/foresight.md).

Reads a lab that ran `lab pipeline` (default: this repo's conf; `--conf DIR` for another) and
prints, from the registry and the train stage's acceptance.jsonl:
  - seconds from the pipeline's first run start to the pilot's forecast (its last estimate, at the
    pilot run's end: the first forecast `lab status` shows), to the first checkpoint estimate of the
    full train, to the last one, and to the final eval's end (the baseline: what you waited for
    without foresight), and the lead time they give;
  - each checkpoint's offline acceptance rate / mean length beside the eval's served figures,
    and the errors of the pilot's, the first and the last forecast.

    .venv/bin/python bench/bench_foresight.py [--conf DIR] [--profile demo]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "py"))

from eaglelab.control.forecast import eval_evidence, offline_evidence, ts
from eaglelab.control.lab import Lab
from eaglelab.stages import acceptance


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conf", default=None)
    ap.add_argument("--profile", default=None)
    args = ap.parse_args()
    lab = Lab.load(args.conf, args.profile)
    runs = lab.registry.runs()
    latest = {r["stage"]: r for r in sorted(runs, key=lambda r: ts(r.get("started_at")) or 0)}
    train, ev = latest.get("train"), latest.get("eval")
    if not train or not ev or ev.get("state") != "completed":
        sys.exit("bench_foresight: this lab has no completed train and eval runs; run `lab pipeline` first")
    start = min(ts(r.get("started_at")) or float("inf") for r in runs)
    spec = lab.launch_spec(lab.cfg.stage("train"))
    docs = acceptance.read(Path(spec["cwd"], spec["outputs"][0]))
    if not docs:
        sys.exit("bench_foresight: no acceptance.jsonl in the train stage's output (train --acceptance-k 0?)")
    measured = eval_evidence(lab, "eval")
    end = ts(ev["ended_at"])
    pilots = [r for r in runs if str(r.get("stage", "")).startswith("pilot") and r.get("state") == "completed"
              and offline_evidence(r) and (ts(r.get("started_at")) or 0) >= start]
    pilot = max(pilots, key=lambda r: ts(r["ended_at"]) or 0) if pilots else None
    if pilot:
        pe, at = offline_evidence(pilot), ts(pilot["ended_at"])
        print(f"pipeline start -> pilot forecast ({pe['checkpoints']} pilot checkpoints): {at - start:7.1f} s "
              f"(lead time {end - at:.1f} s, {100 * (at - start) / (end - start):.0f}% of the way in)")
    print(f"pipeline start -> first forecast (checkpoint {docs[0]['epoch']}): {docs[0]['at'] - start:7.1f} s")
    print(f"pipeline start -> last forecast  (checkpoint {docs[-1]['epoch']}): {docs[-1]['at'] - start:7.1f} s")
    print(f"pipeline start -> train end:                      {ts(train['ended_at']) - start:7.1f} s")
    print(f"pipeline start -> final eval end (baseline):      {end - start:7.1f} s")
    print(f"lead time of the first forecast: {end - docs[0]['at']:.1f} s "
          f"({100 * (docs[0]['at'] - start) / (end - start):.0f}% of the way in)")
    print(f"estimate cost per checkpoint: {sum(d.get('seconds', 0) for d in docs) / len(docs):.1f} s "
          f"on {docs[0]['samples']} held-out rows, k={docs[0]['k']}")
    print("checkpoint  offline rate  offline mean len")
    for d in docs:
        print(f"{d['epoch']:>10}  {d['acceptance_rate']:>12.1%}  {d['mean_acceptance_length']:>16.3f}")
    print(f"eval (served): rate {measured['acceptance_rate']:.1%}, mean length {measured['mean_acceptance_length']:.3f}, "
          f"speedup {measured['speedup']:.2f}x, verdict {measured['verdict']}")
    if pilot:
        print(f"pilot forecast's error: rate {100 * (pe['acceptance_rate'] - measured['acceptance_rate']):+.1f} pts, "
              f"mean length {pe['mean_acceptance_length'] - measured['mean_acceptance_length']:+.3f}")
    for label, d in (("first", docs[0]), ("last", docs[-1])):
        print(f"{label} forecast's error: rate {100 * (d['acceptance_rate'] - measured['acceptance_rate']):+.1f} pts, "
              f"mean length {d['mean_acceptance_length'] - measured['mean_acceptance_length']:+.3f}")


if __name__ == "__main__":
    main()
