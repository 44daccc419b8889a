"""Follow an orphan's log: the run whose jobwrap was killed while its stage lives on.

jobwrap's tailer died with it, so the run's state.json would stand still until the stage ends.
`hostside.read_run` starts this (detached, one per run: it holds `<run_dir>/tailer.lock`) when it
finds a run orphaned; it tails output.log into state.json as jobwrap did, until no process of the
run lives, then writes the final state. How the run ended is decided by the next report.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
from pathlib import Path

from eaglelab.fsutil import read_json

from .hostside import run_processes
from .tail.run import follow_run


def follow(run_dir: Path, poll_s: float = 0.5) -> int:
    fd = os.open(run_dir / "tailer.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another follower has it
    pgid = (read_json(run_dir / "meta.json") or {}).get("pgid")
    stop = threading.Event()
    tailer = threading.Thread(target=follow_run, args=(run_dir, stop), name="tailer", daemon=True)
    tailer.start()
    while run_processes(pgid, run_dir) and not (run_dir / "exit.json").exists():
        time.sleep(poll_s)
    stop.set()
    tailer.join(timeout=60)
    os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(follow(Path(sys.argv[1]).resolve()))
