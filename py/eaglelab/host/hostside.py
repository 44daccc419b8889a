"""What runs on a host: launch a stage through jobwrap, report its runs, stop one, read a log.

No agent, no daemon: the local executor calls these functions in-process; the ssh executor runs
`python -m eaglelab.host.hostside VERB 'JSON'` on the host, one round trip, and reads one JSON object
back. Everything about a process is decided here, where the process is.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from eaglelab.fsutil import UntrustedFolder, atomic_write_json, parse_iso, read_json, trusted_folder, utcnow_iso
from eaglelab.model import ACTIVE, FINAL, BadRecord, Exit, Meta, check, decide_end, signal_text

from . import hostfacts, machine, sizes
from .jobwrap import group_alive
from .machine import free_disk, gpus, inputs_digest, mark_gpu_holders
from .settle import Liveness, SlurmWord, settle
from .tail.run import RunFollower, run_state

SPAWN_GRACE_S = 10.0  # between the spawn and spawned.json; after that, the spawned process must live


class LaunchError(RuntimeError):
    """jobwrap could not be started; no run directory is left behind."""


def new_run_id(stage: str, now: float | None = None) -> str:
    return f"{stage}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}-{secrets.token_hex(2)}"


def runs_dir(work_dir: str | os.PathLike) -> Path:
    return Path(work_dir).expanduser().resolve() / "runs"


def _run_dir(work_dir, run_id: str) -> Path:
    # run ids come from our registry, but a URL or a CLI argument may carry one: refuse paths.
    if not run_id or "/" in run_id or run_id.startswith(".") or "\x00" in run_id:
        raise ValueError(f"bad run id {run_id!r}")
    return runs_dir(work_dir) / run_id


def launch(work_dir: str, spec: dict, wait_s: float = 10.0) -> dict:
    """Start spec["command"] under jobwrap, detached; return the run's meta.json once it exists.

    spec: stage, host, command (argv), cwd, env, profile, fingerprint, python, run_id (optional).
    """
    run_id = spec.get("run_id") or new_run_id(spec["stage"])
    run_dir = _run_dir(work_dir, run_id)
    try:  # runs/: private (meta holds the env), and no folder on its path open to others
        trusted_folder(run_dir.parent, "the run directories' folder")
    except UntrustedFolder as e:
        raise LaunchError(f"{spec['stage']}: {e}; nothing was started") from None
    run_dir.mkdir(exist_ok=False, mode=0o700)
    meta = {"schema": 1, "run_id": run_id, "stage": spec["stage"], "host": spec.get("host", "local"),
            "profile": spec.get("profile"), "fingerprint": spec.get("fingerprint"),
            "command": list(spec["command"]), "cwd": spec.get("cwd") or os.getcwd(),
            "kind": spec.get("kind", "job"), "outputs": [str(o) for o in spec.get("outputs") or []],
            "launched_at": utcnow_iso()}
    try:
        atomic_write_json(run_dir / "meta.json", meta)
    except OSError as e:  # a full disk at launch: no half-made run directory is left to break status
        shutil.rmtree(run_dir, ignore_errors=True)
        raise LaunchError(f"{spec['stage']}: cannot write {run_dir}/meta.json ({e}); free space there") from None
    python = spec.get("python") or sys.executable
    argv = ["nohup", python, "-m", "eaglelab.host.jobwrap", "--run-dir", str(run_dir), "--cwd", meta["cwd"]]
    if spec.get("env"):  # values (tokens, keys) never on a command line: `ps` shows those to everyone
        write_env_file(run_dir / "env.json", spec["env"])
        argv += ["--env-file", str(run_dir / "env.json")]
    argv += ["--", *meta["command"]]
    env = dict(os.environ)
    # jobwrap must import this very package, wherever the host's venv is.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                      env.get("PYTHONPATH")]))
    try:
        with open(run_dir / "jobwrap.log", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=meta["cwd"] if os.path.isdir(meta["cwd"]) else None, env=env,
                                    start_new_session=True, close_fds=True)
    except OSError as e:  # e.g. "Argument list too long": no run was made, leave no fake one behind
        shutil.rmtree(run_dir, ignore_errors=True)
        raise LaunchError(f"{spec['stage']}: cannot start jobwrap ({python}): {e}") from None
    # What was spawned, so that a slow start (a loaded host, a cold venv) reads as pending while
    # that process lives, never as lost (and launched again). nohup execs: the pid is jobwrap's.
    atomic_write_json(run_dir / "spawned.json", {"schema": 1, "pid": proc.pid, "at": utcnow_iso()})
    deadline = time.time() + wait_s
    while time.time() < deadline:
        m = read_json(run_dir / "meta.json") or {}
        if m.get("started_at"):
            return m
        rc = proc.poll()
        if rc is not None and not (read_json(run_dir / "meta.json") or {}).get("started_at"):
            why = ("no space to reserve the run's end record: the disk is full" if rc == 75
                   else f"jobwrap exited {rc} before starting the stage")
            shutil.rmtree(run_dir, ignore_errors=True)
            raise LaunchError(f"{spec['stage']}: {why} ({run_dir}); nothing was started")
        time.sleep(0.02)
    return read_json(run_dir / "meta.json") or meta


def _alive(pid: int | None, run_dir: Path) -> bool:
    """Is pid our jobwrap for run_dir? (pids are reused and test hosts share a pid namespace)"""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if str(run_dir).encode() not in cmdline:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def run_processes(pgid: int | None, run_dir: Path) -> list[int]:
    """The live processes of process group `pgid` that provably belong to this run: ours (same
    uid), in that group, with EAGLELAB_RUN_DIR=run_dir in their environment (jobwrap gives it to
    the stage and so to all its children). pgids are reused and meta.json is only a file: nothing is
    signalled or called alive on the pgid alone."""
    if not pgid:
        return []
    try:
        os.killpg(pgid, 0)  # no such group (the usual case for an old lost run): no /proc scan
    except ProcessLookupError:
        return []
    except PermissionError:
        return []  # another user's group: never ours
    marker = b"EAGLELAB_RUN_DIR=" + str(run_dir).encode() + b"\0"
    uid, found = os.getuid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[2]) != pgid or d.stat().st_uid != uid:
                continue
            if marker in b"\0" + (d / "environ").read_bytes():
                found.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def host_seq() -> str | None:
    """Where this host is in its own time, as `BOOT_ID:MONOTONIC_NS`: a record stamped with it is news
    as of no earlier than that moment. Within one boot the monotonic clock only goes forward, whatever
    a wall clock (this host's or the controller's) does, so the registry orders two reports of a run by
    it (`registry.supersedes`), never by a wall clock. None where the kernel does not say its boot."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{boot}:{time.monotonic_ns()}" if boot else None


def read_run(run_dir: Path, now: float | None = None, slurm: SlurmWord | None = None) -> dict:
    """One run's record from its directory: the facts gathered here, the state decided by
    eaglelab.host.settle (docs/operations.md has the table). slurm: Slurm's word on its job.
    `host_seq`: this host's clock before anything was read (a report stamps its runs with its own)."""
    seq = host_seq()
    now = now or time.time()
    _ours(run_dir)
    meta = _checked(run_dir / "meta.json", Meta)
    if meta is None:
        raise BadRecord(f"{run_dir}/meta.json: missing or unreadable (a launch that failed, or a full disk "
                        f"at launch); move the directory aside once nothing runs there")
    try:
        exit_info = _checked(run_dir / "exit.json", Exit)
        end_unknown = None
    except BadRecord as e:  # jobwrap writes it atomically: unreadable means damage, not half-written
        exit_info, end_unknown = None, str(e)
    stop_requested = (run_dir / "stop_requested").exists()
    rec = {
        "id": meta.get("run_id", run_dir.name), "stage": meta.get("stage"), "host": meta.get("host"),
        "profile": meta.get("profile"), "fingerprint": meta.get("fingerprint"), "kind": meta.get("kind", "job"),
        "run_dir": str(run_dir), "pid": meta.get("pid"), "pgid": meta.get("pgid"),
        "jobwrap_pid": meta.get("jobwrap_pid"), "command": meta.get("command"),
        "started_at": meta.get("started_at"), "heartbeat_at": None, "stop_requested": stop_requested,
        "host_seq": seq, **_attempts(meta),
    }
    try:
        rec["heartbeat_at"] = utcnow_iso((run_dir / "heartbeat").stat().st_mtime)
    except OSError:
        pass
    live = Liveness(wrapper_alive=_alive(meta.get("jobwrap_pid"), run_dir), stop_requested=stop_requested)
    if not live.wrapper_alive and exit_info is None and end_unknown is None:
        exit_info = _checked(run_dir / "exit.json", Exit)  # it may have ended between the reads
    if not live.wrapper_alive and exit_info is None:
        live = _without_wrapper(run_dir, meta, live, end_unknown, now)
    # Settled once without the log, to know what the log needs: a lost run's log read to its end
    # (the wrapper's tailer died with it), an orphan's followed (nothing else follows it).
    first = settle(meta, exit_info, None, live, slurm)
    if first.lost:  # nobody saw the end: the outputs the stage left may prove it
        exit_info = _record_proven_end(run_dir, meta, live) or exit_info
    if (first.state in FINAL and exit_info is None and not first.end_unknown
            or exit_info is not None and exit_info.get("outputs_done")):
        _finish_log_once(run_dir)
    elif first.orphaned:
        follow_orphan(run_dir)
    ls = run_state(run_dir)
    settled = settle(meta, exit_info, ls, live, slurm)
    rec.update(settled.fields())
    rec["stopped"] = exit_info.get("stopped") if exit_info else None
    start, end = parse_iso(rec["started_at"]), parse_iso(rec["ended_at"])
    measured = exit_info.get("duration_s") if exit_info else None
    if isinstance(measured, (int, float)) and measured >= 0:
        rec["duration_s"] = round(float(measured), 3)  # jobwrap's monotonic measure
    else:  # wall clock; never negative after a step back
        rec["duration_s"] = round(max((end or now) - start, 0.0), 3) if start else None
    try:
        rec["log_size"] = (run_dir / "output.log").stat().st_size
    except OSError:
        rec["log_size"] = 0
    return rec


def _attempts(meta: dict) -> dict:
    """How often the run directory was started (jobwrap's `attempt`, plus the starts `requeue: refuse`
    turned away) and why the latest refused one was: a second start is never silent."""
    refused = [r for r in meta.get("refused_starts") or [] if isinstance(r, dict)]
    started = meta.get("attempt") if isinstance(meta.get("attempt"), int) else (1 if meta.get("started_at") else 0)
    return {"attempts": (started + len(refused)) or None,
            "refused_start": refused[-1].get("message") if refused else None}


def _without_wrapper(run_dir: Path, meta: dict, live: Liveness, end_unknown: str | None, now: float) -> Liveness:
    """What lives of a run whose jobwrap is not (or no longer) there and that recorded no end."""
    launched = parse_iso(meta.get("launched_at")) or 0
    spawned = read_json(run_dir / "spawned.json")
    spawned_pid = spawned.get("pid") if isinstance(spawned, dict) else None
    spawning = not meta.get("started_at") and (_alive(spawned_pid, run_dir) or now - launched < SPAWN_GRACE_S)
    stage_alive = not spawning and end_unknown is None and bool(run_processes(meta.get("pgid"), run_dir))
    return live._replace(spawning=spawning, stage_alive=stage_alive, end_unknown=end_unknown,
                   last_sign_of_life=_last_sign_of_life(run_dir, meta))


def outputs_done(run_dir: Path, meta: dict) -> str | None:
    """Whether the stage's outputs say it finished: every output (meta.json's `outputs`, relative to
    its cwd) carries a sound manifest (eaglelab.manifest's layout) written by this very run (its
    `run_id`) — a directory its own manifest.json, a file the manifest.json beside it, listing it.
    Sound: every file it lists is there, of the size it lists. The evidence in words, else None.
    (Read here with the standard library: eaglelab.manifest needs the controller's libraries.)"""
    outputs = meta.get("outputs")
    run_id = meta.get("run_id") or run_dir.name
    if not isinstance(outputs, list) or not outputs:
        return None
    seen = []
    for out in outputs:
        path = Path(meta.get("cwd") or ".", str(out)).expanduser()
        folder, name = (path, None) if path.is_dir() else (path.parent, path.name)
        doc = read_json(folder / "manifest.json")
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, dict) or doc.get("run_id") != run_id or (name is not None and name not in files):
            return None
        for rel, entry in files.items():
            try:
                if not isinstance(entry, dict) or (folder / rel).stat().st_size != entry.get("size"):
                    return None
            except (OSError, ValueError):
                return None
        seen.append(str(folder / "manifest.json"))
    return f"every output carries a sound manifest of this run: {', '.join(dict.fromkeys(seen))}"


def _record_proven_end(run_dir: Path, meta: dict, live: Liveness) -> dict | None:
    """A lost run (wrapper and stage gone, no exit.json) whose outputs prove that the stage finished
    (outputs_done): its end, by the one rule (decide_end), recorded in exit.json in the wrapper's
    place so that it stays decided (a later run rewriting the outputs changes nothing). The exit
    record, or None (then its log may still tell: settle adopts it)."""
    evidence = outputs_done(run_dir, meta)
    if evidence is None:
        return None
    ending = decide_end(None, None, outputs_done=True)
    record = {"schema": 1, "exit_code": None, "signal": None, "signal_name": None,
              "ended_at": live.last_sign_of_life, "state": ending.state.value,
              "stop_requested": live.stop_requested, "orphans": False, "outputs_done": evidence,
              "recorded_by": "a report (the wrapper was gone; the outputs' manifests say the stage finished)"}
    try:
        if not (run_dir / "exit.json").exists():
            atomic_write_json(run_dir / "exit.json", record)
    except OSError:
        pass  # a read-only or full disk: decided the same way on every read
    return _checked(run_dir / "exit.json", Exit) or record


def follow_orphan(run_dir: Path) -> None:
    """Start `python -m eaglelab.host.orphan RUN_DIR` detached, unless one follows this run already
    (it holds tailer.lock): it keeps the orphan's state.json current, as jobwrap's tailer did."""
    try:
        fd = os.open(run_dir / "tailer.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # held: a follower is at work
    finally:
        os.close(fd)  # released: the follower takes it (two racing readers: the second one exits)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                                    os.environ.get("PYTHONPATH")]))}
    try:
        with open(run_dir / "jobwrap.log", "ab") as log:
            subprocess.Popen([sys.executable, "-m", "eaglelab.host.orphan", str(run_dir)], stdin=subprocess.DEVNULL,
                             stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True)
    except OSError:
        pass  # the state stays where the wrapper left it; the end is still read in full (lost)


def write_env_file(path: Path, env: dict) -> None:
    """The stage's environment for jobwrap, readable by this user only (created 0600, then renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({str(k): str(v) for k, v in env.items()}, f)
    os.replace(tmp, path)


def _ours(run_dir: Path) -> None:
    """A run directory, and its meta.json and exit.json, must be the current user's: in a shared
    work dir another user could plant one whose pgid makes `lab stop` signal anything."""
    uid = os.getuid()
    for p in (run_dir, run_dir / "meta.json", run_dir / "exit.json"):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if st.st_uid != uid:
            raise BadRecord(f"{p}: owned by uid {st.st_uid}, not by you (uid {uid}); not a run of yours, "
                            f"so it is neither read nor stopped")


def _finish_log_once(run_dir: Path) -> None:
    state = read_json(run_dir / "state.json")
    try:
        size = (run_dir / "output.log").stat().st_size
    except OSError:
        return
    if isinstance(state, dict) and state.get("final") and state.get("log_bytes") == size:
        return
    try:
        RunFollower(run_dir).finish()
    except OSError:
        pass  # a full or read-only disk: the last state stands


def _last_sign_of_life(run_dir: Path, meta: dict) -> str | None:
    times = []
    for name in ("heartbeat", "output.log"):  # not state.json: readers write it too
        try:
            times.append((run_dir / name).stat().st_mtime)
        except OSError:
            pass
    return utcnow_iso(max(times)) if times else meta.get("started_at") or meta.get("launched_at")


def _checked(path: Path, shape: type) -> dict | None:
    """A run directory's JSON file, checked against its model (eaglelab.model); None if absent.
    Valid JSON of the wrong shape is a BadRecord naming the file, never a crash far away."""
    data = read_json(path)
    if data is None and path.exists():
        raise Unreadable(f"{path} exists but cannot be read as JSON")
    return None if data is None else check(shape, data, str(path))


class Unreadable(BadRecord):
    """A file that is there but cannot be read: not the same as absent."""


def report(work_dir: str, stage: str | None = None) -> dict:
    """Every run on this host (optionally of one stage), plus the host's GPUs. A run directory that
    cannot be read is listed in `bad_runs` with what is wrong, and the others are reported.
    `runs_dir`: the folder read, so that a run the controller knows there and the report lacks is
    known to be missing from it (its directory vanished), not merely elsewhere."""
    seq = host_seq()  # before anything is read: every run below is as of no earlier than this
    root = runs_dir(work_dir)
    runs, bad = [], []
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.is_dir() and not d.name.startswith(".") and (stage is None or d.name.startswith(stage + "-")):
                try:
                    runs.append({**read_run(d), "host_seq": seq})
                except BadRecord as e:
                    bad.append({"run_dir": str(d), "error": str(e)})
    devices = gpus()
    if devices:
        mark_gpu_holders(devices, runs)
    return {"schema": 1, "runs": runs, "bad_runs": bad, "gpus": devices, "checked_at": utcnow_iso(),
            "free_disk_bytes": free_disk(work_dir), "load": list(os.getloadavg()), "runs_dir": str(root),
            "host_seq": seq}


def stop(work_dir: str, run_id: str, grace_s: float = 30.0) -> dict:
    """TERM the stage's process group, KILL it after grace_s; return the run as it ended."""
    run_dir = _run_dir(work_dir, run_id)
    rec = read_run(run_dir)
    if rec["state"] not in ACTIVE:
        return rec
    (run_dir / "stop_requested").write_text(utcnow_iso() + "\n")
    pgid = rec.get("pgid")
    # Ours, provably: jobwrap of this very run directory lives (it made the group), or processes of
    # the group carry this run's EAGLELAB_RUN_DIR. A pgid in meta.json alone proves nothing.
    supervised = _alive(rec.get("jobwrap_pid"), run_dir) and pgid == rec.get("pid")
    if not pgid or not (supervised or run_processes(pgid, run_dir)):
        return read_run(run_dir)  # nothing of this run is alive in that group: signal nobody
    if rec.get("orphaned"):
        return _stop_orphan(run_dir, pgid, grace_s)
    _terminate(pgid)
    deadline = time.time() + grace_s
    # Wait for the whole group, not only the stage's main process: a child that ignores TERM would
    # otherwise keep its GPU memory after `lab stop` returned.
    while time.time() < deadline and (not (run_dir / "exit.json").exists() or group_alive(pgid)):
        time.sleep(0.1)
    if not (run_dir / "exit.json").exists() or group_alive(pgid):
        _killpg(pgid, signal.SIGKILL)
    deadline = time.time() + 10
    while time.time() < deadline and not (run_dir / "exit.json").exists():
        time.sleep(0.05)
    return read_run(run_dir)


def _stop_orphan(run_dir: Path, pgid: int, grace_s: float) -> dict:
    """Stop a stage whose jobwrap is gone, and record its end in jobwrap's place."""
    sig = signal.SIGTERM
    _terminate(pgid)
    deadline = time.time() + grace_s
    while time.time() < deadline and run_processes(pgid, run_dir):
        time.sleep(0.1)
    if run_processes(pgid, run_dir):
        sig = signal.SIGKILL
        _killpg(pgid, sig)
        deadline = time.time() + 10
        while time.time() < deadline and run_processes(pgid, run_dir):
            time.sleep(0.05)
    if not (run_dir / "exit.json").exists():
        atomic_write_json(run_dir / "exit.json", {
            "schema": 1, "exit_code": None, "signal": int(sig), "signal_name": signal_text(int(sig)),
            "ended_at": utcnow_iso(), "state": decide_end(None, int(sig), stop_requested=True).state.value,
            "stop_requested": True, "orphans": False, "recorded_by": "lab stop (the wrapper was gone)"})
    return read_run(run_dir)


def _terminate(pgid: int) -> None:
    """TERM, then CONT, as a shell does for a stopped job: a group someone paused (kill -STOP,
    Ctrl-Z) would otherwise hold the TERM unseen until the KILL, and lose its save-on-TERM."""
    _killpg(pgid, signal.SIGTERM)
    _killpg(pgid, signal.SIGCONT)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def read_log(work_dir: str, run_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
    """limit bytes of the run's log from offset (a mirror resumes here after a cut)."""
    path = _run_dir(work_dir, run_id) / "output.log"
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except FileNotFoundError:
        return b""


AWAIT_STEP_S = 0.2   # how often a waiting controller's question is looked at again, here on the host
AWAIT_MAX_S = 30.0   # the longest one question waits: the controller has gates and side jobs to mind


def await_change(work_dir: str, run_id: str, timeout_s: float, log_offset: int | None = None) -> dict:
    """Return once the run has ended (its exit.json, or its jobwrap gone), once its log is longer
    than log_offset (when given), or after timeout_s: a controller waits here, where looking costs a
    stat, instead of asking again twice a second (over ssh each question starts a Python here)."""
    run_dir = _run_dir(work_dir, run_id)
    deadline = time.monotonic() + max(0.0, min(float(timeout_s), AWAIT_MAX_S))
    meta = read_json(run_dir / "meta.json") or {}
    while True:
        if (run_dir / "exit.json").exists():
            return {"changed": "ended"}
        if meta.get("jobwrap_pid") and not _alive(meta["jobwrap_pid"], run_dir):
            return {"changed": "wrapper_gone"}
        if log_offset is not None:
            try:
                if (run_dir / "output.log").stat().st_size > log_offset:
                    return {"changed": "log"}
            except OSError:
                pass
        if not run_dir.is_dir():
            return {"changed": "gone"}
        if time.monotonic() >= deadline:
            return {"changed": None}
        time.sleep(AWAIT_STEP_S)
        if not meta:  # a run that had not written its meta yet (just launched)
            meta = read_json(run_dir / "meta.json") or {}


def ready(work_dir: str, run_id: str, url: str | None, log_regex: str | None, wait_s: float = 0.0) -> dict:
    """Is the service ready, asked where it runs: its URL fetched from this host (a port of the
    same number on the controller says nothing about it), its log searched here (no log shipped).
    wait_s: ask again here, every AWAIT_STEP_S, until it is ready, its run ends, or wait_s passed."""
    deadline = time.monotonic() + max(0.0, min(float(wait_s), AWAIT_MAX_S))
    while True:
        answer = _ready_now(work_dir, run_id, url, log_regex)
        if answer["ready"] or time.monotonic() >= deadline \
                or (_run_dir(work_dir, run_id) / "exit.json").exists():
            return answer
        time.sleep(AWAIT_STEP_S)


def _ready_now(work_dir: str, run_id: str, url: str | None, log_regex: str | None) -> dict:
    if url:
        import urllib.request
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return {"ready": True, "how": "url"}
        except (OSError, ValueError):
            pass
    if log_regex:
        import re
        if re.search(log_regex.encode(), read_log(work_dir, run_id, 0, 64 << 20)):
            return {"ready": True, "how": "log"}
    return {"ready": False, "how": None}


VERBS = {
    "inputs_digest": lambda a: inputs_digest(a["paths"], a.get("cwd", ".")),
    "paths_info": lambda a: machine.paths_info(a["paths"], a.get("cwd", ".")),
    "manifests": lambda a: machine.read_manifests(a["paths"], a.get("cwd", ".")),
    "inside_roots": lambda a: machine.inside_roots(a["paths"], a["roots"], a.get("cwd", ".")),
    "launch": lambda a: launch(a["work_dir"], a["spec"]),
    "report": lambda a: report(a["work_dir"], a.get("stage")),
    "ready": lambda a: ready(a["work_dir"], a["run_id"], a.get("url"), a.get("log_regex"), a.get("wait_s", 0.0)),
    "await_change": lambda a: await_change(a["work_dir"], a["run_id"], a.get("timeout_s", 5.0), a.get("log_offset")),
    "stop": lambda a: stop(a["work_dir"], a["run_id"], a.get("grace_s", 30.0)),
    "read_log": lambda a: {"data": base64.b64encode(read_log(a["work_dir"], a["run_id"], a.get("offset", 0),
                                                             a.get("limit", 1 << 20))).decode()},
    "input_sizes": lambda a: {"sizes": sizes.measure_all(a.get("requests", []), a.get("cwd", "."))},
    "facts": lambda a: hostfacts.facts(a["work_dir"], a.get("inputs", []), a.get("outputs", []), a.get("cwd", ".")),
}


def main(argv: list[str] | None = None, verbs: dict | None = None) -> int:
    """python -m eaglelab.host.hostside VERB -  (the JSON arguments on stdin: a launch's env holds
    secrets, and a command line is visible to every user of the host)  ->  one JSON object on stdout.
    `VERB 'JSON'` is still read, from older controllers. verbs: the table answered (default VERBS)."""
    argv = sys.argv[1:] if argv is None else argv
    verbs = VERBS if verbs is None else verbs
    if len(argv) != 2 or argv[0] not in verbs:
        print(json.dumps({"error": f"usage: hostside {{{'|'.join(verbs)}}} -|JSON"}))
        return 2
    try:
        result = verbs[argv[0]](json.loads(sys.stdin.read() if argv[1] == "-" else argv[1]))
    except Exception as e:  # noqa: BLE001 - report, never a traceback on the wire
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    # As a program it answers a Slurm login node's verbs too. slurmside builds on this module, so it is
    # imported only here, where this file runs as __main__: no module imports it back.
    from eaglelab.host import slurmside
    sys.exit(main(verbs={**VERBS, **slurmside.VERBS}))
