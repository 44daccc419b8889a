"""A cron firing's cost, and what an unreachable webhook adds to it (nothing, by design).

Builds a throw-away lab of three chained `tick` stages and times `lab cron fire` (the command a
crontab entry runs) end to end: a firing that runs the three stages, and one that finds them up
to date. Each is measured without webhooks (the baseline, same run) and with two webhooks that
cannot be reached — one that accepts and never answers, one on a closed port — as a ratio.

    .venv/bin/python bench/bench_cron.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def black_hole() -> tuple[str, socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    held = []
    threading.Thread(target=lambda: [held.append(s.accept()) for _ in iter(int, 1)], daemon=True).start()
    return f"http://127.0.0.1:{s.getsockname()[1]}/hook", s


def closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/hook"


def make_lab(root: Path, hooks: list[str]) -> dict:
    (root / "conf").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "data" / "src.txt").write_text("v1\n")
    notify = ""
    if hooks:
        notify = "notify:\n  webhooks:\n" + "".join(f"    - {{url: '{u}', format: generic}}\n" for u in hooks)
    (root / "conf" / "lab.yaml").write_text(textwrap.dedent(f"""\
        profile: none
        logs_dir: {root}/logs
        hosts:
          local: {{reach: local, work_dir: {root}/work, repo_dir: {REPO}, python: {REPO}/.venv/bin/python}}
        """) + notify)
    tick = '["${python}", "-m", "eaglelab.stages.tick", "--steps", "3", "--delay", "0.1", "--output", "%s"]'
    (root / "conf" / "pipeline.yaml").write_text(textwrap.dedent(f"""\
        stages:
          a: {{host: local, command: {tick % (root / 'data/a.json')}, inputs: ["{root}/data/src.txt"]}}
          b: {{host: local, depends_on: [a], command: {tick % (root / 'data/b.json')}, inputs: ["{root}/data/a.json"]}}
          c: {{host: local, depends_on: [b], command: {tick % (root / 'data/c.json')}, inputs: ["{root}/data/b.json"]}}
        """))
    return {**os.environ, "EAGLELAB_CONF": str(root / "conf")}


def fire(env: dict) -> float:
    t0 = time.perf_counter()
    p = subprocess.run([str(REPO / "bin" / "lab"), "cron", "fire"], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"firing failed: {p.stdout}{p.stderr}")
    return time.perf_counter() - t0


def kill_drainer(root: Path) -> None:
    try:
        pid = int((root / "logs" / "locks" / "notify-drain.pid").read_text())
        if b"eaglelab.control.notify" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, 9)
    except (OSError, ValueError):
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    hole_url, hole = black_hole()
    results: dict[str, dict[str, list[float]]] = {"none": {"run": [], "skip": []},
                                                   "unreachable": {"run": [], "skip": []}}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for kind in results:  # interleaved, so that load on the machine hits both alike
                root = Path(tmp) / f"{kind}-{i}"
                env = make_lab(root, [] if kind == "none" else [hole_url, closed_port()])
                results[kind]["run"].append(fire(env))
                results[kind]["skip"].append(fire(env))
                kill_drainer(root)
    hole.close()
    for what in ("run", "skip"):
        base = statistics.median(results["none"][what])
        other = statistics.median(results["unreachable"][what])
        label = "firing that runs 3 stages" if what == "run" else "firing that skips 3 stages"
        print(f"{label:<28} no webhook {base:6.2f} s   unreachable webhooks {other:6.2f} s   "
              f"ratio {other / base:4.2f}   (median of {args.repeat})")


if __name__ == "__main__":
    main()
