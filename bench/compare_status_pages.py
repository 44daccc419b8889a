"""What users see, from two checkouts, compared byte for byte: `lab status --json`, `lab status`
(the terminal) and every page and API answer of the status page (/, /hosts, /metrics, /api/status,
each run's page and /api/runs/<id>), on a 50-run lab (bench_status_cpu.build_lab); then the page's
answers for two made-up statuses that carry every block the page formats (forecast and its history,
side jobs and the engine check, outcome with its sweep, configuration notice, GPUs and their
holders, preflight in each form, a Slurm job's place): one well formed, one with garbled fields.

  git archive COMMIT | tar -x -C /tmp/before && ln -s $PWD/.venv /tmp/before/.venv
  python bench/compare_status_pages.py --repo /tmp/before --repo . [--keep DIR]

The clock is frozen (libfaketime, FAKETIME) so that times on the pages agree; the registry is
filled once and every checkout reads it with --no-refresh (a refresh would ask the host again: its
load and free disk change between two calls). Exit 1 when the lab's or the well-formed status's
answers differ; the garbled status's differences are listed (a garbled field reads as absent, and a
change there can be meant).
"""

from __future__ import annotations

import argparse
import copy
import filecmp
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAKETIME_LIBS = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1")
FROZEN = "2026-12-05 12:00:00"


def frozen_env(base: dict) -> dict:
    lib = next((p for p in FAKETIME_LIBS if Path(p).exists()), None)
    if lib is None:
        raise SystemExit("compare: libfaketime is needed (apt-get install faketime): the pages show clock times")
    return {**base, "LD_PRELOAD": lib, "FAKETIME": FROZEN, "TZ": "UTC"}


def made_up_statuses(ws) -> dict[str, dict]:
    """Every block the page formats, well formed ("rich") and garbled, on tests/web_samples' status."""
    s = ws.lab_status()
    acc = lambda r, m: {"acceptance_rate": r, "mean_acceptance_length": m}
    s["pipeline"]["forecast"] = {
        "source": "eval", **acc(0.61, 2.84), "speedup": 1.72, "verdict": "PAYS", "reasons": ["speedup 1.72x", 3],
        "checkpoints": 2, "run": "eval-1", "made_at": ws.iso(-900), "decoding": "sampled", "sampled": acc(0.55, 2.1),
        "greedy": acc(0.63, 2.9), "served_checkpoint": {**acc(0.5, 2.2), "epoch": 3, "run": "smoke-serve_eval-1"},
        "offline": {**acc(0.58, 2.5), "sampled": acc(0.52, 2.0), "greedy": acc(0.60, 2.6), "source": "checkpoint"}}
    s["pipeline"]["forecast_history"] = [
        {"train_run": "train-1", "forecast_rate": 0.6, "eval_rate": 0.62, "error": -0.02, "source": "checkpoint",
         "decoding": "greedy", "forecast_sampled_rate": 0.5, "eval_sampled_rate": 0.49, "sampled_error": 0.01},
        {"train_run": "train-2", "forecast_rate": 0.55, "eval_rate": 0.5, "error": 0.05, "source": "pilot",
         "decoding": "sampled", "forecast_greedy_rate": 0.6, "eval_greedy_rate": None, "greedy_error": None}]
    engine = {"served_rate": 0.1, "offline_rate": 0.5, "ratio": 0.2, "min_ratio": 0.8, "drafts": 120, "alarm": True}
    s["pipeline"]["side_jobs"] = [
        {"current_config": True, "stage": "smoke-train", "beside": "extract", "smoke_of": "train", "state": "failed",
         "run": "smoke-train-1", "ended_at": ws.iso(-60), "reason": "bad_argument: Unknown loss"},
        {"stage": "engine_check", "beside": "synth", "state": "failed", "run": "engine_check-1",
         "reason": "engine-path alarm", "engine": engine},
        {"stage": "engine_check2", "beside": "synth", "state": "completed", "run": "engine_check-2",
         "engine": {**engine, "ratio": 1.0, "alarm": False}},
        {"stage": "pilot", "beside": "synth", "state": "pending", "run": None}]
    s["outcome"] = {
        "verdict": "FASTER", "eval_verdict": "PAYS", "measured": True, "eval_run": "eval-1", **acc(0.61, 2.84),
        "speedup": 1.72, "per_position": [0.8, 0.6, 0.43], "spec_tokens_per_s": 120.5, "baseline_tokens_per_s": 70.1,
        "coverage": 0.975, "reasons": ["speedup 1.72x"], "decided_at": {"concurrency": 4, "sampling": "greedy"},
        "sweep": [{"sampling": "greedy", "concurrency": 1, "baseline_tokens_per_s": 70.0, "spec_tokens_per_s": 120.0,
                   "speedup": 1.71, "speedup_min": 1.6, "speedup_max": 1.8, "acceptance_rate": 0.61, "same": "64/64",
                   "verdict": "PAYS"},
                  {"sampling": "sampled", "concurrency": 4, "speedup": 1.1, "same": None, "verdict": "NEUTRAL"}],
        "finished_at": ws.NOW - 100, "took_s": 7200.0,
        "history": [{"run_id": "eval-1", "state": "completed", "ended_at": ws.iso(-100), "verdict": "FASTER",
                     **acc(0.61, 2.84), "speedup": 1.72},
                    {"run_id": "eval-0", "state": "failed", "ended_at": ws.iso(-5000), "verdict": "NOT MEASURED"}]}
    s["config"] = {"conf_dir": "/lab/conf", "files": ["/lab/conf/lab.yaml"], "loaded_at": ws.iso(-10),
                   "reloaded": {"at": ws.iso(-30), "files": ["/lab/conf/pipeline.yaml", "/else/x.yaml"]},
                   "error": {"at": ws.iso(-5), "files": ["/lab/conf/lab.yaml"], "message": "bad key <x>"}}
    s["hosts"][0].update(load=[1.5, 0.75, 0.2], bad_runs=[{"run_dir": "/x", "error": "bad meta"}], gpus=[
        {"index": 0, "name": "NVIDIA H100", "utilization_pct": 97.0, "memory_used_mib": 70000,
         "memory_total_mib": 81559, "runs": [s["runs"][1]["id"]], "other_processes": 2},
        {"index": 1, "name": None, "utilization_pct": None, "memory_used_mib": None, "memory_total_mib": 0, "runs": []}])
    s["runs"][2]["preflight"] = [{"name": "gpu_memory", "ok": False, "detail": "needs 80 GiB", "fix": "use gpu3"},
                                 {"check": "disk", "ok": True, "message": "fine"}, {"check": "w", "ok": None}]
    s["runs"][0]["log_state"]["preflight"] = {"cuda": True, "ram": {"ok": False, "detail": "low"}}
    s["runs"][1]["slurm"] = {"job_id": 1234, "state": "RUNNING", "reason": "None", "queue_position": 3,
                             "queued_s": 95.0, "start_estimate": ws.iso(60), "nodelist": "node[1-2]",
                             "submitted_at": ws.iso(-ws.seeds_drift_history()[-1][0] - 400)}
    g = copy.deepcopy(s)
    g["pipeline"]["forecast"].update(mean_acceptance_length="x", speedup=[1], verdict=None, checkpoints="2",
                                     made_at=5, reasons="r", offline=[], sampled={"acceptance_rate": "high"},
                                     served_checkpoint="no")
    g["pipeline"]["forecast_history"] = [{"forecast_rate": "a", "error": True}, 7]
    g["pipeline"]["side_jobs"] = [{"run": "x-1", "engine": {"served_rate": "no"}}, "junk"]
    g["outcome"].update(per_position=[0.5, "x", None], sweep=[{"speedup": "1"}, 3], history="h", decided_at={},
                        reasons=None, finished_at="t")
    g["config"]["error"] = "broken"
    g["hosts"][0].update(load=[1, "2", 3], gpus=[{"index": 0, "utilization_pct": "97", "runs": "all"}, "gpu"],
                         free_disk_bytes="lots")
    g["runs"][2]["preflight"] = {"checks": [{"check": "x", "ok": "yes"}, 5]}
    g["runs"][1]["slurm"] = {"queue_position": True, "queued_s": "long"}
    return {"rich": s, "garbled": g}


def save_answers(client, paths: list[str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for p in paths:
        r = client.get(p)
        name = p.strip("/").replace("/", "_").replace("?", "_") or "index"
        (out / name).write_bytes(f"{r.status_code}\n".encode() + r.get_data())


def child(repo: Path, conf: Path, out: Path) -> None:
    """In a process of its own, with `repo` first on the path: its page's answers, under out/."""
    sys.path[:0] = [str(repo / "py"), str(repo), str(repo / "tests")]
    os.environ.pop("EAGLELAB_TOKEN", None)
    import time

    import web_samples
    from eaglelab.control.lab import Lab
    from status_web.app import create_app
    now = time.time()
    app = create_app(Lab.load(str(conf)), start=False, clock=lambda: now, ask_hosts=False)
    app.extensions["eaglelab"].snapshot.refresh_now()
    c = app.test_client()
    ids = [r["id"] for r in json.loads(c.get("/api/status").get_data())["runs"]]
    save_answers(c, ["/api/status", "/", "/?partial=1", "/hosts", "/metrics"] + [f"/runs/{i}" for i in ids]
                 + [f"/api/runs/{i}" for i in ids[:5]], out / "lab")
    for name, status in made_up_statuses(web_samples).items():
        app = create_app(source=lambda s=status: copy.deepcopy(s), start=False, clock=lambda: web_samples.NOW)
        app.extensions["eaglelab"].snapshot.refresh_now()
        save_answers(app.test_client(), ["/api/status", "/", "/hosts", "/metrics"]
                     + [f"/runs/{r['id']}" for r in status["runs"]], out / name)


def differing(a: Path, b: Path) -> list[str]:
    out = []
    cmp = filecmp.dircmp(a, b)
    out += [f"{a.name}/{n} (in one only)" for n in cmp.left_only + cmp.right_only]
    out += [str((a / n).relative_to(a.parent)) for n in cmp.common_files
            if not filecmp.cmp(a / n, b / n, shallow=False)]
    for sub in cmp.common_dirs:
        out += differing(a / sub, b / sub)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", action="append", metavar="CHECKOUT", help="two checkouts to compare")
    ap.add_argument("--keep", metavar="DIR", help="build the lab in DIR and keep it (a lab there is reused)")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--out", metavar="DIR", help="where the answers go (default: a temporary folder)")
    ap.add_argument("--child", nargs=3, metavar=("REPO", "CONF", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*map(Path, args.child))
        return 0
    if len(args.repo or []) != 2:
        raise SystemExit("compare: give two --repo")
    sys.path[:0] = [str(REPO / "bench")]
    from bench_status_cpu import PY, build_lab
    root = Path(args.keep or tempfile.mkdtemp(prefix="eaglelab-compare-"))
    if not (root / "conf").is_dir():
        build_lab(root, args.runs)
    conf = root / "conf"
    out = Path(args.out or tempfile.mkdtemp(prefix="eaglelab-compare-out-"))
    env = {**os.environ, "EAGLELAB_CONF": str(conf), "COLUMNS": "160"}
    env.pop("EAGLELAB_PROFILE", None)
    first = Path(args.repo[0]).resolve()
    subprocess.run([str(first / "bin" / "lab"), "status", "--json"], env=env, check=True, capture_output=True)
    frozen = frozen_env(env)
    dirs = []
    for i, repo in enumerate(Path(r).resolve() for r in args.repo):
        d = out / f"{i}-{repo.name}"
        (d / "cli").mkdir(parents=True, exist_ok=True)
        for name, argv in (("status.json", ["status", "--json", "--no-refresh"]), ("status.txt", ["status", "--no-refresh"])):
            p = subprocess.run([str(repo / "bin" / "lab"), *argv], env=frozen, check=True, capture_output=True)
            (d / "cli" / name).write_bytes(p.stdout)
        subprocess.run([str(PY if PY.exists() else sys.executable), __file__, "--child", str(repo), str(conf), str(d)],
                       env=frozen, check=True)
        dirs.append(d)
    a, b = dirs
    n = sum(len(files) for _, _, files in os.walk(a))
    diffs = differing(a, b)
    print(f"{n} answers per checkout ({len(json.loads((a / 'cli' / 'status.json').read_bytes())['runs'])} runs); "
          f"{a} vs {b}")
    for d in diffs:
        print(f"  differs: {d}")
    bad = [d for d in diffs if not d.startswith("garbled")]
    print("identical" if not diffs else f"{len(diffs)} differ ({len(bad)} outside the garbled status)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
