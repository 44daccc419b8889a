"""CPU of one `lab status --json` with 50 runs in the registry (issue 31, item 7: at most 0.3 s).

A throw-away lab in a temporary folder: the repository's own conf/pipeline.yaml and demo profile
(every stage, service, side job, gate and prior of the real pipeline), one host `local` whose
work_dir is in the folder. 50 real runs are made there through the real launch path
(hostside.launch -> jobwrap -> tailer): short shell commands that print a progress bar, cycling
over the pipeline's stages, most completed, some failed. Then `bin/lab status --json` (asks the
host: reads the 50 run directories) and `--no-refresh` (the registry only) run N times each, as
the tests and the page's refresher run them: a new process each time.

Measured: user + system CPU of the child process (resource.getrusage(RUSAGE_CHILDREN) deltas),
and wall time; the median and the minimum of N, after one warm-up call (it fills the registry and
writes the bytecode caches, as any earlier call on a user's machine has). Python's own start is printed beside it
(`python -c pass`, and `python -c "import eaglelab.control.cli"`: the imports alone).

  python bench/bench_status_cpu.py [--runs 50] [--repeat 7] [--keep DIR] [--repo CHECKOUT ...]

--repo measures the `bin/lab` of other checkouts on the same lab, in turns (before/after a change:
`git archive COMMIT | tar -x -C /tmp/before`, then `--repo /tmp/before --repo .`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "py"), str(REPO)]
LAB = REPO / "bin" / "lab"
PY = REPO / ".venv" / "bin" / "python"


def build_lab(root: Path, n_runs: int) -> dict:
    """conf/ (the repo's pipeline + demo profile, one local host) and n_runs finished runs."""
    from eaglelab import config
    from eaglelab.host import hostside

    conf = root / "conf"
    (conf / "profiles").mkdir(parents=True)
    shutil.copy(REPO / "conf" / "pipeline.yaml", conf / "pipeline.yaml")
    shutil.copy(REPO / "conf" / "profiles" / "demo.yaml", conf / "profiles" / "demo.yaml")
    work = root / "work"
    (conf / "lab.yaml").write_text(
        f"profile: demo\nlogs_dir: {root / 'logs'}\nhosts:\n  local:\n    reach: local\n"
        f"    work_dir: {work}\n    repo_dir: {REPO}\n    python: {PY if PY.exists() else sys.executable}\n"
        f"    gpus: 0\n")
    cfg = config.load(str(conf), None)
    stages = cfg.stage_order()
    launched = []
    for i in range(n_runs):
        stage = stages[i % len(stages)]
        fail = i % 7 == 3
        total = 40
        bar = "".join(f"\\r{stage}: {k * 100 // total:3d}%|{'#' * (k // 4):<10}| {k}/{total} "
                      f"[00:{k:02d}<00:{total - k:02d},  1.00it/s]" for k in range(0, total + 1, 4))
        script = "printf 'starting %s\\n%b\\n' \"$0\" \"$1\"" + ("; echo 'Error: boom' >&2; exit 3" if fail else "")
        # a fingerprint, as every launched run has (status compares the side jobs' with the config's)
        meta = hostside.launch(str(work), {"stage": stage, "host": "local", "profile": "demo", "kind": "job",
                                           "fingerprint": f"{i:016x}", "command": ["sh", "-c", script, stage, bar],
                                           "cwd": str(root)})
        launched.append(meta["run_id"])
    deadline = time.time() + 300
    for rid in launched:  # every run ended (exit.json written by its jobwrap)
        while not (work / "runs" / rid / "exit.json").exists():
            if time.time() > deadline:
                raise SystemExit(f"bench: run {rid} did not end within 300 s")
            time.sleep(0.05)
    return {"conf": conf, "runs": launched, "stages": len(stages)}


def child_cpu(argv: list[str], env: dict) -> tuple[float, float, str]:
    """(CPU seconds user+sys, wall seconds, stdout) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv)} -> {p.returncode}\n{p.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, p.stdout


def measure(name: str, argv: list[str], env: dict, repeat: int) -> dict:
    cpus, walls, out = [], [], ""
    for _ in range(repeat):
        cpu, wall, out = child_cpu(argv, env)
        cpus.append(cpu)
        walls.append(wall)
    row = {"what": name, "cpu_median_s": statistics.median(cpus), "cpu_min_s": min(cpus),
           "wall_median_s": statistics.median(walls), "n": repeat}
    print(f"  {name:<44} CPU median {row['cpu_median_s']:.3f} s  min {row['cpu_min_s']:.3f} s   "
          f"wall median {row['wall_median_s']:.3f} s  (n={repeat})", flush=True)
    row["stdout"] = out
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--keep", metavar="DIR", help="build the lab in DIR and keep it (to profile by hand); "
                                                 "a lab already there is used as it is")
    ap.add_argument("--repo", action="append", metavar="CHECKOUT",
                    help="whose bin/lab to measure (repeatable; default: this checkout)")
    ap.add_argument("--limit", type=float, default=0.3, help="the CPU budget the median is held to (s)")
    args = ap.parse_args()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="eaglelab-status-bench-"))
    try:
        t0 = time.time()
        if (root / "conf").is_dir():
            from eaglelab import config
            lab = {"conf": root / "conf", "stages": len(config.load(str(root / "conf"), None).stage_order()),
                   "runs": sorted(p.name for p in (root / "work" / "runs").iterdir())}
            args.runs = len(lab["runs"])
        else:
            lab = build_lab(root, args.runs)
        print(f"lab: {args.runs} runs over {lab['stages']} stages in {root} (made in {time.time() - t0:.1f} s); "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        env = {**os.environ, "EAGLELAB_CONF": str(lab["conf"])}
        env.pop("EAGLELAB_PROFILE", None)
        # as on a user's machine: the modules' bytecode cached in __pycache__ (the warm-up call writes
        # it); without it every call compiles eaglelab's sources again (~0.1 s more)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        py = str(PY if PY.exists() else sys.executable)
        floor = measure("python -c pass", [py, "-c", "pass"], env, args.repeat)
        for repo in [Path(r).resolve() for r in args.repo or [REPO]]:
            lab_bin = str(repo / "bin" / "lab")
            print(f"{repo}:")
            child_cpu([lab_bin, "status", "--json"], env)  # the first one fills the registry (and caches)
            measure("python -c 'import eaglelab.control.cli'", [py, "-c", "import eaglelab.control.cli"],
                    {**env, "PYTHONPATH": f"{repo / 'py'}:{repo}"}, args.repeat)
            fresh = measure("lab status --json", [lab_bin, "status", "--json"], env, args.repeat)
            cached = measure("lab status --json --no-refresh", [lab_bin, "status", "--json", "--no-refresh"], env,
                             args.repeat)
            st = json.loads(fresh["stdout"])
            assert len(st["runs"]) == args.runs, f"{len(st['runs'])} runs in the status, {args.runs} made"
            ok = fresh["cpu_median_s"] <= args.limit
            print(f"lab status --json, {args.runs} runs: {fresh['cpu_median_s']:.3f} s CPU (median of {args.repeat}; "
                  f"--no-refresh {cached['cpu_median_s']:.3f} s; python's own start {floor['cpu_median_s']:.3f} s) "
                  f"-> {'within' if ok else 'OVER'} the {args.limit} s budget", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
