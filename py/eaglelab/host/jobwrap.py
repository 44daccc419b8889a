"""jobwrap: run one stage command on its host and record how it went, whatever happens around it.

Started detached (setsid + nohup, stdin from /dev/null) by `hostside.launch`. The wrapper is the
session leader; the stage runs in a process group of its own, so that `lab stop` can signal the
whole stage (TERM, then KILL) while the wrapper lives on to write `exit.json` — even when the
stage dies of SIGKILL. Files of the run directory: see docs/interfaces.md.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from eaglelab.fsutil import atomic_write_json, read_json, utcnow_iso
from eaglelab.model import RunState, decide_end, signal_text

HEARTBEAT_S = 5.0
ORPHAN_GRACE_S = 5.0
# How long the end's record waits for the tailer's last state. A tailer still reading a backlog
# then (a stage that wrote a GiB in seconds) finishes after exit.json, from where it is: the log
# is parsed once, and the end is recorded within seconds of the exit whatever the backlog.
TAILER_WAIT_S = 3.0
# Every stage gets these: unbuffered Python output reaches the log as it happens, and Rich
# (speculators' logger) would otherwise wrap metric lines at 80 columns when writing to a file.
STAGE_ENV = {"PYTHONUNBUFFERED": "1", "COLUMNS": "1000"}


def end_state(exit_code: int | None, sig: int | None, stop_requested: bool = False) -> str:
    """exit.json's state: the one rule (eaglelab.model.decide_end), before the log is read."""
    return decide_end(exit_code, sig, stop_requested=stop_requested).state.value


def _start_log_follower(run_dir: Path, stop: threading.Event, disk: DiskFull) -> threading.Thread | None:
    """Parse the log where it is written (tailer, if this install has it) into state.json."""
    try:
        from .tail import follow_run  # provided by the tailer; absent in a minimal install
    except ImportError:
        return None
    t = threading.Thread(target=follow_run, args=(run_dir, stop, disk.guard), name="tailer", daemon=True)
    t.start()
    return t


EXIT_RESERVE = 4096  # bytes set aside at start: the end is recorded even when the disk fills up


class ExitRecord:
    """exit.json's space, taken before the stage starts: a full disk cannot lose the end. The record
    is written into the reserved file in place (padded: JSON allows trailing spaces), synced, and
    renamed to exit.json: no new block is needed at the end."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / ".exit.reserved"
        with open(self.path, "wb") as f:  # raises on a disk already full: then nothing is started
            f.write(b" " * EXIT_RESERVE)
            f.flush()
            os.fsync(f.fileno())

    def write(self, record: dict) -> None:
        data = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
        if len(data) > EXIT_RESERVE:  # never: a record is a few hundred bytes
            atomic_write_json(self.path.with_name("exit.json"), record)
            return
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, data + b" " * (EXIT_RESERVE - len(data)), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(self.path, self.path.with_name("exit.json"))


class DiskFull:
    """Set by any thread of jobwrap that met ENOSPC; they go on (the stage must be recorded)."""

    def __init__(self):
        self.seen_at: str | None = None

    def guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except OSError as e:
            if e.errno == errno.ENOSPC and self.seen_at is None:
                self.seen_at = utcnow_iso()
            # any other write error of a side file is not worth the stage's record either


# A run's files of one start: moved to attempt-N/ when its run directory is started again.
ATTEMPT_FILES = ("output.log", "state.json", "exit.json", "heartbeat")


def begin_attempt(run_dir: Path, meta: dict) -> dict:
    """meta for this start of run_dir. A run directory is started once, except by Slurm: it requeues
    a preempted job (SLURM_RESTART_COUNT grows) and, when slurmctld restarts without its saved
    state, the same job id again with a count of 0. Every start after the first is an attempt of
    its own: the earlier one is recorded in `attempts` (when it started, how it ended: None when
    its end was never recorded) and its files move to attempt-N/ (N = its attempt - 1), so its
    exit.json cannot pass for this start's end and `lab status` counts the starts."""
    meta = dict(meta)
    if not meta.get("started_at"):
        meta["attempt"] = 1
        return meta
    n = meta.get("attempt") if isinstance(meta.get("attempt"), int) else 1
    dest = run_dir / f"attempt-{n - 1}"
    end = read_json(run_dir / "exit.json") or read_json(dest / "exit.json")
    end = end if isinstance(end, dict) else {}
    earlier = {"attempt": n, "started_at": meta.get("started_at"), "jobwrap_pid": meta.get("jobwrap_pid"),
               "pid": meta.get("pid"), "ended": end.get("state"), "ended_at": end.get("ended_at")}
    dest.mkdir(exist_ok=True)
    for name in ATTEMPT_FILES:
        if (run_dir / name).exists():
            os.replace(run_dir / name, dest / name)
    meta["attempts"] = [*(meta.get("attempts") or []), earlier]
    meta["attempt"] = n + 1
    print(f"jobwrap: {run_dir.name}: start {n + 1} of this run directory (the earlier one started "
          f"{earlier['started_at']}, ended {earlier['ended'] or 'unrecorded'}; its files are in {dest.name}/)",
          file=sys.stderr, flush=True)
    return meta


def run(run_dir: Path, command: list[str], cwd: str, env_extra: dict[str, str]) -> int:
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = read_json(run_dir / "meta.json") or {}
    try:
        exit_record = ExitRecord(run_dir)
    except OSError as e:  # no room even for the end's record: start nothing unsupervised
        print(f"jobwrap: cannot reserve space for the run's end in {run_dir} ({e}); the stage was not "
              f"started", file=sys.stderr, flush=True)
        return 75  # EX_TEMPFAIL
    disk = DiskFull()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup, also when not started through nohup
    meta = begin_attempt(run_dir, meta)  # before the log is opened: a second start's earlier files move

    env = dict(os.environ)
    env.update(STAGE_ENV)
    env.update(env_extra)
    env["EAGLELAB_RUN_DIR"] = str(run_dir)
    env["EAGLELAB_RUN_ID"] = meta.get("run_id", run_dir.name)

    log = open(run_dir / "output.log", "ab", buffering=0)
    started = time.time()
    started_mono = time.monotonic()  # durations by the monotonic clock: a wall-clock step changes none
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=cwd, env=env, start_new_session=True)
    except OSError as e:
        log.write(f"jobwrap: cannot start {command[0]!r} in {cwd!r}: {e}\n".encode())
        meta.update(started_at=utcnow_iso(started), jobwrap_pid=os.getpid(), pid=None, pgid=None)
        disk.guard(atomic_write_json, run_dir / "meta.json", meta)
        exit_record.write({
            "schema": 1, "exit_code": 127, "signal": None, "signal_name": None,
            "ended_at": utcnow_iso(), "state": RunState.FAILED, "error": str(e)})
        return 127

    meta.update(started_at=utcnow_iso(started), jobwrap_pid=os.getpid(), pid=child.pid, pgid=child.pid,
                command=command, cwd=cwd, env={k: env[k] for k in STAGE_ENV},
                env_keys=sorted(env_extra))  # the stage's own values (secrets, maybe) are not recorded
    meta.setdefault("schema", 1)
    meta.setdefault("run_id", run_dir.name)
    disk.guard(atomic_write_json, run_dir / "meta.json", meta)  # the stage runs: never die here

    # A TERM/INT to the wrapper itself is passed on to the stage; the wrapper still records the end.
    def forward(signum, _frame):
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    stop = threading.Event()

    def heartbeat():
        while not stop.is_set():
            disk.guard(lambda: (run_dir / "heartbeat").write_text(utcnow_iso() + "\n"))
            stop.wait(HEARTBEAT_S)

    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
    follower = _start_log_follower(run_dir, stop, disk)

    rc, stops = _wait_counting_stops(child)
    ended = time.time()
    duration_s = time.monotonic() - started_mono
    # CPU seconds of the stage and every descendant it waited for: where a host's cores went
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    exit_code, sig = (None, -rc) if rc < 0 else (rc, None)
    # A server's worker processes exit a moment after its main process: only a group still there
    # after ORPHAN_GRACE_S is reported (it may hold GPU memory).
    orphans = _wait_group_gone(child.pid, ORPHAN_GRACE_S)
    stop.set()
    if follower is not None:
        follower.join(timeout=TAILER_WAIT_S)  # the last lines' state before the end, when quick
    stop_requested = (run_dir / "stop_requested").exists()
    record = {"schema": 1, "exit_code": exit_code, "signal": sig, "signal_name": signal_text(sig),
              "ended_at": utcnow_iso(ended), "duration_s": round(duration_s, 3),
              "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
              "state": end_state(exit_code, sig, stop_requested), "stop_requested": stop_requested,
              "orphans": orphans, "attempt": meta["attempt"]}
    if stops:  # paused (SIGSTOP, Ctrl-Z on the host): that time was no work, and the ETA history must know
        record["stopped"] = {"total_s": round(sum(s for _, _, s in stops), 3),
                             "intervals": [[utcnow_iso(a), utcnow_iso(b)] for a, b, _ in stops]}
    if disk.seen_at and record["state"] == RunState.FAILED:
        # the log may lack the stage's own "No space left" (it could not be written either)
        record["failure"] = {"reason": "disk_full", "line": None, "process": None,
                             "message": f"no space left on the device of {run_dir} (seen {disk.seen_at}); "
                                        f"free space there, then run the stage again (it resumes)"}
    exit_record.write(record)
    disk.guard(lambda: (run_dir / "heartbeat").write_text(utcnow_iso() + "\n"))
    if follower is not None:
        follower.join()  # a backlog: the tailer reads on to the log's end (it sees exit.json now)
        disk.guard(_ensure_final_state, run_dir)
    log.close()
    return rc if rc >= 0 else 128 - rc


def _wait_counting_stops(child: subprocess.Popen) -> tuple[int, list[tuple[float, float, float]]]:
    """The stage's return code (as Popen's: -N for a signal) and the spans it spent stopped, as
    [(from, to) by the wall clock, seconds by the monotonic one]: a stage someone paused (kill -STOP
    of its group, Ctrl-Z on the host) does no work meanwhile, so that time is not its duration's to
    teach the ETA history (registry.record_phases_from_runs subtracts it). Seen through waitpid's
    WUNTRACED/WCONTINUED: the stage's own process, which a stop of its group stops too."""
    stops: list[tuple[float, float, float]] = []
    since: tuple[float, float] | None = None
    while True:
        try:
            _, status = os.waitpid(child.pid, os.WUNTRACED | os.WCONTINUED)
        except ChildProcessError:  # reaped elsewhere (never here): Popen's word
            rc = child.wait()
            break
        if os.WIFSTOPPED(status):
            since = since or (time.time(), time.monotonic())
            continue
        if os.WIFCONTINUED(status):
            if since is not None:
                stops.append((since[0], time.time(), time.monotonic() - since[1]))
                since = None
            continue
        rc = os.waitstatus_to_exitcode(status)
        child.returncode = rc
        break
    if since is not None:  # ended while stopped (a KILL of a stopped group)
        stops.append((since[0], time.time(), time.monotonic() - since[1]))
    return rc, stops


def _ensure_final_state(run_dir: Path) -> None:
    """The recorded state must cover the whole log: if the tailer died before its end (a bug, a
    full disk for its last write), parse the log here (the only case it is read twice)."""
    state = read_json(run_dir / "state.json") or {}
    try:
        size = (run_dir / "output.log").stat().st_size
    except OSError:
        return
    if state.get("final") and state.get("log_bytes") == size:
        return
    print(f"jobwrap: the tailer stopped early (state covers {state.get('log_bytes')} of {size} bytes); "
          f"final pass here", flush=True)
    try:
        from .tail.run import RunFollower  # provided by the tailer; absent in a minimal install
        RunFollower(run_dir).finish()
    except Exception as e:  # noqa: BLE001 - the end must be recorded whatever the parser does
        print(f"jobwrap: final parse failed: {type(e).__name__}: {e}", flush=True)


def _wait_group_gone(pgid: int, grace_s: float) -> bool:
    """True if processes of the group are still alive after grace_s."""
    deadline = time.time() + grace_s
    while group_alive(pgid):
        if time.time() > deadline:
            return True
        time.sleep(0.1)
    return False


def group_alive(pgid: int) -> bool:
    """True when processes of the stage's group outlived it (they may still hold GPU memory)."""
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jobwrap", description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--cwd", default=".")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="non-secret settings only: a command line is visible to every user (ps)")
    p.add_argument("--env-file", type=Path, help="the stage's environment as a JSON object (a 0600 file)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("no command after --")
    env = dict(kv.split("=", 1) for kv in a.env)
    if a.env_file:
        try:
            env.update({str(k): str(v) for k, v in json.loads(a.env_file.read_text()).items()})
        except (OSError, ValueError, AttributeError) as e:
            p.error(f"--env-file {a.env_file}: {e}")
    return run(a.run_dir.resolve(), command, a.cwd, env)


if __name__ == "__main__":
    sys.exit(main())
