"""Training's step ETA (the state JSON's `training`, what the page shows during a train stage with
no bar) on the recorded speculators train logs, beside a simple baseline measured in the same run.

    /work/main/.venv/bin/python bench/bench_train_eta.py

Every log is replayed line by line through the tailer's state machine (eaglelab.eta.replay.
replay_steps); at every step line the ETA to the log's last step (the truth: the log's time of that
step minus the time now, by the log's own timestamps) is scored; steps under 2 s before the end
are skipped. Per log, the median relative error |eta - truth| / truth of
  ours        the estimator (eaglelab.eta.bar_eta on the steps' history)
  mean rate   elapsed since the first step / steps since it x steps left
and the share of observations whose truth lies in [eta_low_s, eta_high_s]. The plan the parser
inferred (total steps) is printed beside the steps the log really ran.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from eaglelab.eta.replay import replay_steps

LOGS = [ROOT / "tests/fixtures/logs/recorded/h200/train.log",
        ROOT / "tests/fixtures/logs/gpu_rehearsal_deepseek_v3_train.log",
        ROOT / "tests/fixtures/logs/recorded/cpu_speculators_train.log"]
MIN_TRUTH_S = 2.0


def score(path: Path) -> dict | None:
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    rows = [r for r in replay_steps(lines) if r.elapsed_s is not None]
    if len(rows) < 3:
        return None
    last = rows[-1]
    horizon_rows = [r for r in replay_steps(lines, horizon=last.step) if r.elapsed_s is not None]
    t_end = next(r.elapsed_s for r in horizon_rows if r.step >= last.step)
    t0, s0 = horizon_rows[0].elapsed_s, horizon_rows[0].step
    ours, mean, covered = [], [], 0
    for r in horizon_rows:
        truth = t_end - r.elapsed_s
        if r.step >= last.step or truth < MIN_TRUTH_S or r.eta_s is None or r.step <= s0:
            continue
        base = (r.elapsed_s - t0) / (r.step - s0) * (last.step - r.step)
        ours.append(abs(r.eta_s - truth) / truth)
        mean.append(abs(base - truth) / truth)
        covered += r.eta_low_s <= truth <= r.eta_high_s
    if not ours:
        return None
    return {"log": path.relative_to(ROOT), "steps": last.step, "inferred_total": last.total_steps,
            "seconds": t_end, "obs": len(ours), "ours": statistics.median(ours),
            "mean": statistics.median(mean), "coverage": covered / len(ours)}


def main() -> None:
    scored = {p: score(p) for p in LOGS}
    results = [s for s in scored.values() if s is not None]
    for p, s in scored.items():
        if s is None:
            print(f"not scored: {p.relative_to(ROOT)} (no step {MIN_TRUTH_S:.0f} s or more before its last one)")
    print("| log | steps run | total the parser inferred | s | obs. | ours | mean rate | truth in range |")
    print("|---|---|---|---|---|---|---|---|")
    for s in results:
        print(f"| {s['log']} | {s['steps']:.0f} | {s['inferred_total']} | {s['seconds']:.0f} | {s['obs']} | "
              f"{s['ours']:.3f} | {s['mean']:.3f} | {s['coverage']:.0%} |")
    if results:
        med = statistics.median
        print(f"median over logs: ours {med(s['ours'] for s in results):.3f}   mean rate "
              f"{med(s['mean'] for s in results):.3f}   coverage {med(s['coverage'] for s in results):.0%}")


if __name__ == "__main__":
    main()
