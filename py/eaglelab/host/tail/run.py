"""Follow one run directory: its output.log into its state.json, live, until told to stop.

Used in-process by jobwrap (`follow_run` in a thread) and by `lab tail` for many runs at once.
state.json is written atomically, at most every MIN_WRITE_S while lines arrive (so p95 latency
from a line written to the state updated stays far under 250 ms), and every IDLE_WRITE_S while
nothing arrives (so a stall shows without new lines).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import threading
import time
from pathlib import Path

from eaglelab.fsutil import atomic_write_bytes, parse_iso, read_json, utcnow_iso
from eaglelab.model import RunState, StageState

from ..parse.state import LogState, combine_with_exit
from .follower import FileFollower
from .frames import FrameSplitter
from .whole import bar_eta

MIN_WRITE_S = 0.05
WRITE_DUTY = 10.0       # wait at least this many times the last write's cost before the next
IDLE_WRITE_S = 5.0
POLL_S = 1.0            # read the file at least this often even without a watchdog event
HEARTBEAT_FRESH_S = 15.0
SILENT_MAX_S = 1800.0   # a live stage that wrote nothing at all for this long is called stalled
# At most this much log is parsed between two looks at the clock: a backlog (a stage that wrote a
# GiB in seconds) is read in slices, with state.json written between them (each slice ~0.1-0.3 s).
READ_SLICE = 2 << 20


def earlier_phase_durations(run_dir: Path, limit: int = 10) -> dict[str, float]:
    """Median duration of each phase in the latest `limit` earlier runs of the same stage.

    Runs of a stage are sibling directories named `<stage>-<time>-<hex>` (docs/interfaces.md);
    their state.json lists phases with durations. Used to call a phase that runs far longer than
    it used to stalled.
    """
    run_dir = Path(run_dir)
    stage = (read_json(run_dir / "meta.json") or {}).get("stage") or run_dir.name.rsplit("-", 2)[0]
    own = re.compile(re.escape(stage) + r"-\d{8}T\d{6}-[0-9a-f]+")  # not `serve-x-…` for stage `serve`
    try:
        siblings = sorted((p for p in run_dir.parent.glob(f"{stage}-*")
                           if p != run_dir and own.fullmatch(p.name) and p.is_dir()), key=lambda p: p.name)[-limit:]
    except OSError:
        return {}
    seen: dict[str, list[float]] = {}
    for sib in siblings:
        st = read_json(sib / "state.json") or {}
        for ph in st.get("phases") or []:
            if isinstance(ph, dict) and isinstance(ph.get("duration_s"), (int, float)) and ph.get("name"):
                seen.setdefault(ph["name"], []).append(float(ph["duration_s"]))
    return {name: statistics.median(v) for name, v in seen.items() if v}


class RunFollower:
    """The parser and the file reader of one run; read() takes in what was appended, write() the state."""

    def __init__(self, run_dir: Path, clock=time.time, tick=time.monotonic) -> None:
        self.run_dir = Path(run_dir)
        self.clock = clock  # wall clock: timestamps in the state
        self.tick = tick    # monotonic: throttles (a wall-clock step back must not freeze the state)
        self.state = LogState(expected_phase_s=earlier_phase_durations(self.run_dir), bar_eta=bar_eta)
        self.reader = FileFollower(self.run_dir / "output.log")
        self._now: float | None = None
        self.splitter = FrameSplitter(self._line, self._frame, on_provisional=self._provisional,
                                      on_block=self._block)
        self.dirty = True
        self.behind = False  # more of the log is waiting than the last read() took
        self.last_write = 0.0
        self.write_cost_s = 0.0
        self.writes = 0

    def _line(self, text: str, lineno: int) -> None:
        self.state.feed_line(text, lineno, self._now)

    def _block(self, blk: bytes, first: int, max_line: int) -> int | None:
        return self.state.feed_block(blk, first, max_line, self._now)

    def _frame(self, text: str, lineno: int) -> None:
        self.state.feed_frame(text, lineno, self._now)

    def _provisional(self, text: str, lineno: int) -> None:
        self.state.feed_provisional(text, lineno, self._now)

    def read(self, max_bytes: int | None = None) -> int:
        """Read what was appended (at most max_bytes of it); returns the number of bytes.
        `behind` says afterwards whether more is waiting in the file."""
        got = 0
        for kind, data in self.reader.read_new(max_bytes):
            self._now = self.clock()
            if kind == "reset":
                self.splitter.reset()
                continue
            got += len(data)
            self.splitter.feed(data)
        if got:
            self.state.lines = self.splitter.lines
            self.state.garbled = self.splitter.bad
            self.dirty = True
        self.behind = max_bytes is not None and got >= max_bytes and self.reader.unread() > 0
        return got

    def snapshot(self, final: bool = False) -> dict:
        now = self.clock()
        exit_info = read_json(self.run_dir / "exit.json")
        if exit_info is not None and self.behind:
            # ended, but its log is not read to the end yet: what was read so far, not final (a
            # reader combines it with exit.json, as with any state written before the end)
            exit_info, alive = None, False
        else:
            alive = None if exit_info else process_alive(self.run_dir, now)
        if exit_info is not None:
            self.state.end_of_log()  # the process has exited and its log is read: it is complete
        snap = self.state.snapshot(now=now, alive=alive, exit_info=exit_info)
        silent = self._silent_for(now) if alive and exit_info is None and self.reader.offset == 0 else None
        if silent is not None and silent > SILENT_MAX_S and snap.get("state") == RunState.RUNNING:
            # not one byte since the start: the log-based rules have nothing to go on, this one does
            snap["state"] = StageState.STALLED
            snap["stall"] = {"reason": "silent", "idle_s": round(silent, 1),
                             "message": f"no output at all in {silent / 60:.0f} min since the stage started"}
        snap["updated_at"] = utcnow_iso(now)
        snap["log_bytes"] = self.reader.offset
        snap["final"] = final or exit_info is not None
        return snap

    def write(self, final: bool = False) -> dict:
        t0 = time.perf_counter()
        snap = self.snapshot(final)
        write_state(self.run_dir / "state.json", snap)
        self.write_cost_s = time.perf_counter() - t0
        self.last_write = self.tick()
        self.writes += 1
        self.dirty = False
        return snap

    def due(self) -> tuple[bool, float]:
        """(write now?, else how long to wait before asking again), by the monotonic clock."""
        since = self.tick() - self.last_write
        if self.dirty and since >= self.min_interval_s or since >= IDLE_WRITE_S:
            return True, POLL_S
        if self.dirty:
            return False, self.min_interval_s - since
        return False, min(POLL_S, IDLE_WRITE_S - since)

    def _silent_for(self, now: float) -> float | None:
        started = parse_iso((read_json(self.run_dir / "meta.json") or {}).get("started_at"))
        return now - started if started else None

    @property
    def min_interval_s(self) -> float:
        """Writes throttled to MIN_WRITE_S, or longer when a write costs much (a big state): writing
        state.json takes at most a tenth of one core, however chatty the log."""
        return max(MIN_WRITE_S, WRITE_DUTY * self.write_cost_s)

    def finish(self) -> dict:
        """Final pass: read to EOF, count the partial last line, write the final state."""
        self.read()
        self.behind = False
        self._now = self.clock()
        self.splitter.flush()
        self.state.lines = self.splitter.lines
        self.state.garbled = self.splitter.bad
        snap = self.write(final=True)
        self.reader.close()
        return snap


def write_state(path: Path, state: dict) -> None:
    """Atomically (temp + fsync + rename), compact: it is rewritten often and metric curves are long."""
    atomic_write_bytes(path, json.dumps(state, separators=(",", ":")).encode() + b"\n")


def process_alive(run_dir: Path, now: float) -> bool | None:
    """Whether the stage's process lives: its pid exists (not a zombie) or jobwrap's heartbeat is fresh.

    None when the run directory says nothing about a process (a bare log).
    """
    meta = read_json(run_dir / "meta.json") or {}
    pid = meta.get("pid")
    if isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
        except (OSError, IndexError):
            return True
    try:
        beat = os.stat(run_dir / "heartbeat").st_mtime
    except FileNotFoundError:
        return None
    return now - beat < HEARTBEAT_FRESH_S


def follow_run(run_dir: Path, stop: threading.Event, guard=None) -> None:
    """Tail run_dir/output.log into run_dir/state.json until stop is set and the log is read to its
    end; then a final pass.

    The log is read in slices (READ_SLICE) with state.json written between them when due, so a
    backlog shows as progress, never as "no state file yet". jobwrap runs this in a thread; it
    writes exit.json once this returns or after a few seconds, whichever comes first (a backlog
    must not delay the end's record), and waits for the last state. `run_state(run_dir)` combines
    the state with exit.json for readers. `guard(fn)` runs each state write (jobwrap's: a full
    disk is noted, and the tailer goes on reading).
    """
    guard = guard or (lambda fn, *args: fn(*args))
    from .watch import DirWatch  # watchdog: only a live follow needs it, not `lab parse` of a whole file

    run_dir = Path(run_dir)
    follower = RunFollower(run_dir)
    changed = threading.Event()
    watch = DirWatch()
    try:
        watch.add(run_dir, changed)
    except OSError:
        watch = None  # no inotify (e.g. out of watches): polling alone still works
    try:
        left = None  # bytes of backlog at the stop: read that much, not what leftover writers add
        while True:
            if left is None and stop.is_set():  # before the read: what was written before the stop is read
                left = follower.reader.unread()
            got = follower.read(READ_SLICE)
            if left is not None:
                left -= got
                if left <= 0 or not follower.behind:
                    break
            write_now, timeout = follower.due()
            if write_now:
                guard(follower.write)
            if not follower.behind:
                changed.wait(max(0.0, timeout))
                changed.clear()
        guard(follower.finish)
    finally:
        if watch is not None:
            watch.stop()


def run_state(run_dir: Path) -> dict | None:
    """state.json combined with exit.json when the run has ended: what status readers should show."""
    run_dir = Path(run_dir)
    state = read_json(run_dir / "state.json")
    exit_info = read_json(run_dir / "exit.json")
    if not isinstance(exit_info, dict):
        exit_info = None
    if state is None and exit_info is not None and exit_info.get("failure") and not (run_dir / "state.json").exists():
        # never written (a full disk from the start): jobwrap's own diagnosis is all there is
        state = {"schema": 1, "state": RunState.RUNNING, "failure": None}
    if not isinstance(state, dict):
        return state  # absent, half-written or of the wrong shape: readers say so (log_state_status)
    if exit_info is not None and "exit" not in state:
        state = combine_with_exit(state, exit_info)
    return state


__all__ = ["follow_run", "run_state", "RunFollower", "process_alive"]
