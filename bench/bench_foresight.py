"""Foresight's lead time and error on a finished demo pipeline (docs/foresight.md).

Reads a lab that ran `lab pipeline` (default: this repo's conf; `--conf DIR` for another) and
prints, from the registry and the train stage's acceptance.jsonl:
  - seconds from the pipeline's first run start to the pilot's forecast (its last estimate, at the
    pilot run's end: the first forecast `lab status` shows), to the first checkpoint estimate of the
    full train, to the last one, and to the final eval's end (the baseline: what you waited for
    without foresight), and the lead time they give;
  - each checkpoint's offline acceptance (every start; the greedy chain, against the served greedy
    figure; the sampled chain, against the served sampled one) and the pilot's last, with their errors.

    .venv/bin/python bench/bench_foresight.py [--conf DIR] [--profile demo]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "py"))

from eaglelab.control.foresight.forecast import eval_evidence, offline_evidence, ts
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
    if pilot:
        print(f"pilot lead as a fraction of the run: {(end - at) / (end - start):.2f} ({end - at:.1f} s of "
              f"{end - start:.1f} s)")
    print(f"estimate cost per checkpoint: {sum(d.get('seconds', 0) for d in docs) / len(docs):.1f} s "
          f"on {docs[0]['samples']} held-out rows, k={docs[0]['k']}")
    ms = measured.get("sampled") or {}
    print(f"eval (served): greedy rate {measured_greedy(measured):.1%}, mean length "
          f"{measured['mean_acceptance_length']:.3f}, speedup {measured['speedup']:.2f}x, verdict {measured['verdict']}"
          + (f"; sampled rate {ms['acceptance_rate']:.2%}" if ms.get("acceptance_rate") is not None else ""))
    print("checkpoint  every start      greedy chain (error)          sampled chain (error)")
    for d in docs:
        print(f"{d['epoch']:>10}  {d['acceptance_rate']:>6.1%} {d['mean_acceptance_length']:.3f}  "
              f"{errors(d.get('chain'), d.get('sampled'), measured)}")
    if pilot:
        print(f"pilot (its last)  {pe['all_starts']['acceptance_rate']:>6.1%}  "
              f"{errors(pe.get('greedy'), pe.get('sampled'), measured)}")
    for label, d in (("first", docs[0]), ("last", docs[-1])):
        print(f"{label} forecast's error (every start): rate "
              f"{100 * (d['acceptance_rate'] - measured_greedy(measured)):+.1f} pts, "
              f"mean length {d['mean_acceptance_length'] - measured['mean_acceptance_length']:+.3f}")


def measured_greedy(measured: dict) -> float:
    """The served greedy rate: the eval's headline, or its greedy cell beside a sampled verdict."""
    g = measured.get("greedy") if measured.get("decoding") == "sampled" else None
    return (g or measured)["acceptance_rate"]


def errors(chain: dict | None, sampled: dict | None, measured: dict) -> str:
    """'rate / length (error vs served greedy)   rate (error vs served sampled)' for one estimate."""
    out = ""
    if chain:
        out += (f"{chain['acceptance_rate']:>6.1%} / {chain['mean_acceptance_length']:.3f} "
                f"({100 * (chain['acceptance_rate'] - measured_greedy(measured)):+5.1f} pts)")
    ms = measured.get("sampled") or {}
    if sampled and ms.get("acceptance_rate") is not None:
        out += (f"    {sampled['acceptance_rate']:>7.2%} ({100 * (sampled['acceptance_rate'] - ms['acceptance_rate']):+5.2f}"
                " pts)")
    return out

if __name__ == "__main__":
    main()
