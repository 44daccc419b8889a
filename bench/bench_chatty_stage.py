"""A chatty stage's end: how soon exit.json and state.json come when the log outgrows the parser.

Runs a stage under the real jobwrap that writes --mb MiB of 105-byte log lines as fast as it can,
then exits; polls the run directory every 50 ms and prints when the first state.json came, how
many distinct states were seen, how long after the stage's end exit.json came, when jobwrap
finished, and whether jobwrap had to parse the log a second time (issue 32 item 5).

    nice -n 19 .venv/bin/python bench/bench_chatty_stage.py --mb 1024 --run-dir /tmp/chatty
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGE = r"""
import sys, time
line = b"INFO 12-04 11:40:00 [loader.py:120] step %08d loss 0.123456 lr 0.000100 tokens 4096 grad_norm 1.2345\n"
target, i, n = int(sys.argv[1]) << 20, 0, 0
while n < target:
    chunk = b"".join(line % (i + k) for k in range(1000))
    i += 1000
    n += sys.stdout.buffer.write(chunk)
sys.stdout.flush()
open(sys.argv[2], "w").write(repr(time.time()))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200, help="MiB of log the stage writes")
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/chatty"), help="the run directory (emptied first)")
    a = ap.parse_args()
    run = a.run_dir
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True, mode=0o700)
    ended_file = run.with_name(run.name + ".ended")
    t0 = time.time()
    p = subprocess.Popen([str(REPO / "bin" / "jobwrap"), "--run-dir", str(run), "--", sys.executable, "-c", STAGE,
                          str(a.mb), str(ended_file)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first_state = exit_seen = None
    seen = set()
    while p.poll() is None:
        try:
            seen.add((run / "state.json").stat().st_mtime_ns)
            first_state = first_state or time.time()
        except FileNotFoundError:
            pass
        if exit_seen is None and (run / "exit.json").exists():
            exit_seen = time.time()
        time.sleep(0.05)
    done = time.time()
    out = p.stdout.read().decode()
    stage_end = float(ended_file.read_text())
    exit_mtime = (run / "exit.json").stat().st_mtime
    state = json.loads((run / "state.json").read_text())
    print(f"stage wrote {a.mb} MiB in {stage_end - t0:.1f} s; first state.json at "
          f"{'never' if first_state is None else f'{first_state - t0:.1f} s'}; {len(seen)} states seen; "
          f"exit.json {exit_mtime - stage_end:.1f} s after the stage's end; jobwrap done at {done - t0:.1f} s; "
          f"final state: {state.get('lines')} lines, final={state.get('final')}, "
          f"log read {'twice' if 'final pass' in out else 'once'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
