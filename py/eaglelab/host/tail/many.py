"""`lab tail`: follow many run directories in one process, with one watchdog observer."""

from __future__ import annotations

import threading
from pathlib import Path

from eaglelab.errors import EaglelabError
from eaglelab.fsutil import read_json

from .run import IDLE_WRITE_S, POLL_S, RunFollower, run_state, write_state
from .watch import DirWatch


def is_run_dir(d: Path) -> bool:
    return (d / "output.log").exists() or (d / "meta.json").exists()


def _settled(run: Path) -> bool:
    """An ended run whose state.json already covers its whole log: combine it with exit.json, no re-read."""
    try:
        if not (run / "exit.json").exists() or (run / "state.json").stat().st_mtime < (run / "output.log").stat().st_mtime:
            return False
    except FileNotFoundError:
        return False
    state = read_json(run / "state.json")
    if not state or not state.get("final"):
        return False
    if "exit" not in state:
        write_state(run / "state.json", run_state(run))
    return True


def _runs_under(d: Path) -> list[Path]:
    if is_run_dir(d):
        return [d]
    return sorted(p for p in d.iterdir() if p.is_dir() and is_run_dir(p))


def watch_runs(dirs: list[Path], stop: threading.Event, once: bool = False) -> int:
    """Keep every run's state.json current until stop; returns how many runs were followed."""
    for d in dirs:
        if not d.is_dir():
            raise EaglelabError(f"{str(d)!r} is not a directory: give run directories (<work_dir>/runs/<run_id>) "
                                "or a directory of them (<work_dir>/runs)")
    followers: dict[Path, RunFollower] = {}
    ended: set[Path] = set()
    changed = threading.Event()
    watch = None if once else DirWatch()
    watched: set[Path] = set()

    def discover() -> None:
        for d in dirs:
            for run in _runs_under(d):
                if run not in followers and run not in ended:
                    if _settled(run):
                        ended.add(run)
                        continue
                    followers[run] = RunFollower(run)
                    if watch is not None and run not in watched:
                        watch.add(run, changed)
                        watched.add(run)
            if watch is not None and d not in watched and not is_run_dir(d):
                watch.add(d, changed, names=None)  # new run directories appear here
                watched.add(d)

    try:
        while True:
            discover()
            for run, f in list(followers.items()):
                f.read()
                if (run / "exit.json").exists():
                    f.finish()
                    ended.add(run)
                    del followers[run]
                elif f.dirty and f.clock() - f.last_write >= f.min_interval_s or \
                        f.clock() - f.last_write >= IDLE_WRITE_S or once:
                    f.write()
            if once or stop.is_set():
                for f in followers.values():
                    f.write()
                    f.reader.close()
                return len(followers) + len(ended)
            changed.wait(POLL_S)
            changed.clear()
    finally:
        if watch is not None:
            watch.stop()
