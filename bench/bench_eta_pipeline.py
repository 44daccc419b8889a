"""Stage and pipeline ETAs on real multi-phase runs: the error of the predicted finish time at 10%,
25% and 50% of the run, beside what the current progress bar alone says (tqdm's remaining time).

    /work/main/.venv/bin/python bench/bench_eta_pipeline.py [--runs 4] [--scale 1.0]

Runs a real two-stage pipeline (bench/eta_workload.py: extract = load -> encode (bar) -> write,
then train = warmup -> train (bar); real CPU work, one thread) --runs times. While each stage runs,
its log is parsed live every 0.5 s by the same parser the tailer uses (eaglelab.host.parse.state), so
every sample is the state JSON `lab status` would have shown then. Afterwards each run is scored
with the *other* runs as history (leave one out; host and profile the same): at 10/25/50% of the
stage (for the `extract` stage) and of the whole pipeline, `eta.annotate` on the status of that
moment gives a finish time, compared with the real one. The baseline is the progress bar: now +
tqdm's printed remaining time of the current bar (0 when no bar is running), which is what a user
reading the log would plan with.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from eaglelab.eta import annotate
from eaglelab.fsutil import parse_iso, utcnow_iso
from eaglelab.host.parse.state import LogState

STAGES = ("extract", "train")
FRACTIONS = (0.10, 0.25, 0.50)
_TERM = re.compile(r"([^\r\n]*)([\r\n])")


def run_stage(stage: str, scale: float, log_path: Path) -> dict:
    """Run one stage for real; sample its parsed state every 0.5 s. Returns start, end, samples."""
    state = LogState()
    buf, lineno, samples = "", 0, []
    with open(log_path, "wb") as log:
        start = time.time()
        p = subprocess.Popen([sys.executable, str(ROOT / "bench" / "eta_workload.py"), stage, "--scale", str(scale)],
                             stdout=log, stderr=subprocess.STDOUT)
        with open(log_path, "rb") as reader:
            while True:
                alive = p.poll() is None
                buf += reader.read().decode("utf-8", errors="replace")
                now = time.time()
                pos = 0
                for m in _TERM.finditer(buf):
                    text, term = m.groups()
                    if term == "\n":
                        lineno += 1
                        state.feed_line(text, lineno, now)
                    else:
                        state.feed_frame(text, lineno + 1, now)
                    pos = m.end()
                buf = buf[pos:]
                if buf:
                    state.feed_provisional(buf, lineno + 1, now)  # the newest frame, as the tailer does
                samples.append((now, state.snapshot(now=now, alive=alive)))
                if not alive:
                    break
                time.sleep(0.5)
        end = time.time()
    return {"start": start, "end": end, "samples": samples, "final": samples[-1][1], "exit": p.returncode}


def history_from(runs: list[dict], skip: int) -> dict:
    out = []
    for k, run in enumerate(runs):
        if k == skip:
            continue
        for stage in STAGES:
            s = run[stage]
            phases = [{"name": ph["name"], "duration_s": ph["duration_s"]}
                      for ph in s["final"]["phases"] if ph.get("duration_s") is not None]
            out.append({"run_id": f"{stage}-{k}", "stage": stage, "host": "local", "profile": "bench",
                        "duration_s": s["end"] - s["start"], "phases": phases})
    return {"runs": out}


def sample_at(stage_run: dict, t: float) -> dict | None:
    before = [s for when, s in stage_run["samples"] if when <= t]
    return before[-1] if before else None


def status_at(run: dict, k: int, t: float) -> dict:
    runs, stages, prev = [], [], []
    for stage in STAGES:
        s = run[stage]
        rid = f"{stage}-{k}"
        stages.append({"name": stage, "host": "local", "kind": "job", "depends_on": prev[-1:],
                       "latest_run": rid if t >= s["start"] else None,
                       "state": "completed" if t >= s["end"] else "running" if t >= s["start"] else "pending"})
        if t >= s["start"]:
            done = t >= s["end"]
            runs.append({"id": rid, "stage": stage, "host": "local", "state": "completed" if done else "running",
                         "exit_code": 0 if done else None, "signal": None, "started_at": utcnow_iso(s["start"]),
                         "ended_at": utcnow_iso(s["end"]) if done else None,
                         "duration_s": (s["end"] - s["start"]) if done else None,
                         "log_state": s["final"] if done else sample_at(s, t)})
        prev.append(stage)
    return {"schema": 1, "generated_at": utcnow_iso(t), "profile": "bench", "runs": runs, "hosts": [], "stages": stages}


def bar_baseline(status: dict, t: float) -> float:
    """now + the current bar's printed remaining time (what the log itself tells)."""
    running = [r for r in status["runs"] if r["state"] == "running"]
    prog = (running[0]["log_state"] or {}).get("progress") if running else None
    left = prog.get("tqdm_remaining_s") if prog and prog.get("n") != prog.get("total") else None
    return t + (left or 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--scale", type=float, default=1.0)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):
            run = {stage: run_stage(stage, args.scale, Path(tmp) / f"{stage}-{k}.log") for stage in STAGES}
            assert all(run[s]["exit"] == 0 for s in STAGES), "a workload stage failed"
            runs.append(run)
            print(f"run {k}: extract {run['extract']['end'] - run['extract']['start']:.1f} s, "
                  f"train {run['train']['end'] - run['train']['start']:.1f} s", flush=True)

    rows: dict[tuple[str, float], list[tuple[float, float, bool]]] = {}
    for k, run in enumerate(runs):
        hist = history_from(runs, k)
        for scope in ("stage extract", "pipeline"):
            t0 = run["extract"]["start"]
            t_end = run["extract"]["end"] if scope == "stage extract" else run["train"]["end"]
            for f in FRACTIONS:
                t = t0 + f * (t_end - t0)
                status = status_at(run, k, t)
                out = annotate(status, hist, t)
                if scope == "pipeline":
                    eta = out["pipeline"]
                    pred, lo, hi = (eta["finish_at"], eta["finish_low_at"], eta["finish_high_at"])
                else:
                    e = next(s for s in out["stages"] if s["name"] == "extract")["eta"]
                    pred, lo, hi = e["finish_at"], e["finish_low_at"], e["finish_high_at"]
                left = t_end - t
                ours = abs(parse_iso(pred) - t_end) / left
                base = abs(bar_baseline(status, t) - t_end) / left
                covered = parse_iso(lo) - 1e-3 <= t_end <= parse_iso(hi) + 1e-3
                rows.setdefault((scope, f), []).append((ours, base, covered))

    print(f"\n{len(runs)} runs, leave-one-out history (same host/profile), relative error of the finish time "
          f"(|predicted - real| / time left), medians over runs:")
    print(f"  {'scope':16s} {'at':>5s} {'eaglelab':>9s} {'bar only':>9s} {'ratio':>6s} {'in range':>9s}")
    for (scope, f), vals in rows.items():
        ours = statistics.median(v[0] for v in vals)
        base = statistics.median(v[1] for v in vals)
        cov = sum(v[2] for v in vals) / len(vals)
        print(f"  {scope:16s} {f:5.0%} {ours:9.3f} {base:9.3f} {ours / base if base else float('nan'):6.2f} {cov:9.0%}")


if __name__ == "__main__":
    main()
