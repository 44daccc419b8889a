"""The offline forecasts of a finished demo lab's checkpoints beside what vLLM served (issue 30, item 2).

For a directory where `make demo` ran (its data/demo/: checkpoints, prepared rows, hidden states, the
eval's report.json), re-estimates the train stage's checkpoints on the same held-out rows as the
train hook did, three ways: every start (the estimate before the chain), vLLM's greedy restart
chain, and speculative sampling's expected chain at the eval's temperature and top-p; and prints
each beside the eval's served greedy figure and its sampled cells, with the errors. Reads only.

    .venv/bin/python bench/bench_forecast_chain.py DEMO_DIR [DEMO_DIR ...] [--epochs 0 5] [--pilot]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "py"))

from eaglelab.stages import acceptance


def served(report: dict) -> dict:
    at = report["decided_at"]["concurrency"]
    cells = {(r["sampling"], r["concurrency"]): r["spec"] for r in report["sweep"]}
    out = {"greedy": (report["acceptance_rate"], report["mean_acceptance_length"]), "at": at}
    out["sampled"] = {c: (s["acceptance_rate"], s["mean_acceptance_length"]) for (m, c), s in cells.items()
                      if m == "sampled"}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("demo_dirs", nargs="+", type=Path, help="where `make demo` ran (holds data/demo)")
    ap.add_argument("--epochs", nargs="*", type=int, default=None, help="checkpoints to estimate (default: all)")
    ap.add_argument("--pilot", action="store_true", help="the pilot's checkpoints, on its own held-out rows")
    args = ap.parse_args()
    for root in args.demo_dirs:
        os.chdir(root.resolve())  # the checkpoints name their verifier relative to the lab: data/demo/model
        d = Path("data") / "demo"
        report = json.loads((d / "eval" / "report.json").read_text())
        sampled_params = (report["settings"].get("sampled") or [{}])[0]
        temp, top_p = float(sampled_params.get("temperature", 0.0)), float(sampled_params.get("top_p", 1.0))
        sv = served(report)
        lm_head = acceptance.verifier_lm_head(d / "model", "cpu")
        w = d / "pilot" if args.pilot else d  # where the checkpoints, rows and hidden states are
        epochs = args.epochs if args.epochs is not None else sorted(
            int(p.name) for p in (w / "checkpoints").iterdir() if p.name.isdigit())
        g_rate, g_len = sv["greedy"]
        print(f"{root}{' (pilot)' if args.pilot else ''}: served greedy at concurrency {sv['at']}: {g_rate:.1%} / {g_len:.3f}; sampled (T={temp:g}, "
              f"top-p {top_p:g}): " + ", ".join(f"c={c} {r:.2%} / {n:.3f}" for c, (r, n) in sorted(sv["sampled"].items())))
        print(f"  {'checkpoint':>10}  {'every start':>16}  {'greedy chain':>16}  {'error':>9}  {'sampled chain':>16}  "
              f"{'error (c=' + str(sv['at']) + ')':>14}  {'s':>5}")
        for e in epochs:
            t0 = time.monotonic()
            doc = acceptance.estimate(acceptance.load_checkpoint(w / "checkpoints" / str(e)), lm_head,
                                      acceptance.held_out_samples(w / "prepared", w / "hidden_states", 0.9, None), 3,
                                      temp, top_p)
            ch, sd = doc["chain"], doc["sampled"] or {}
            s_served = sv["sampled"].get(sv["at"])
            s_err = f"{100 * (sd['acceptance_rate'] - s_served[0]):+.2f} pts" if sd and s_served else "-"
            s_txt = f"{sd['acceptance_rate']:.2%} / {sd['mean_acceptance_length']:.3f}" if sd else "-"
            print(f"  {e:>10}  {doc['acceptance_rate']:>7.1%} / {doc['mean_acceptance_length']:.3f}  "
                  f"{ch['acceptance_rate']:>7.1%} / {ch['mean_acceptance_length']:.3f}  "
                  f"{100 * (ch['acceptance_rate'] - g_rate):>+5.1f} pts  {s_txt:>16}  {s_err:>14}  "
                  f"{time.monotonic() - t0:>5.1f}")


if __name__ == "__main__":
    main()
