"""Unattended runs: the crontab entry that fires the pipeline, and the lock that keeps firings apart.

A cron job gets only HOME, LOGNAME, PATH=/usr/bin:/bin and SHELL=/bin/sh, so the entry spells out
everything: `cd` to this checkout, the venv's python by absolute path, PYTHONPATH, PATH with the
venv's bin first, EAGLELAB_CONF (and EAGLELAB_PROFILE when one was chosen). It runs
`lab cron fire --target T`, which writes one log per firing under <logs_dir>/cron/ and holds an
flock for the whole firing: a second firing exits at once, and the kernel drops the lock of a
firing that was killed, so a dead firing never blocks the next one.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from croniter import croniter

from eaglelab.config import REPO_ROOT
from eaglelab.errors import EaglelabError
from eaglelab.fsutil import atomic_write_json, private_dir, read_json, utcnow_iso
from eaglelab.model import RunState

TAG = "eaglelab"
DEFAULT_SCHEDULE = "0 3 * * *"
BUSY_EXIT = 75  # EX_TEMPFAIL: another firing is running; this one did nothing
KEEP_FIRINGS = 200  # logs/cron keeps the logs and summaries of this many firings (months of nights)


class CronError(EaglelabError):
    """A bad schedule or target, or a crontab that cannot be read or written."""


# -- the entry (pure) ---------------------------------------------------------------------------

def check_schedule(schedule: str) -> str:
    """The schedule, normalized, or a CronError saying what a cron schedule looks like."""
    s = " ".join(schedule.split())
    fields = s.split(" ")
    ok = (len(fields) == 5 or (len(fields) == 1 and s.startswith("@") and s != "@reboot")) and croniter.is_valid(s)
    if not ok:
        raise CronError(f"--schedule {schedule!r}: not a cron schedule; give 5 fields "
                        f"'minute hour day-of-month month day-of-week' (e.g. '0 3 * * *' for 03:00 every night, "
                        f"'30 */6 * * *' for every 6 hours) or @hourly/@daily/@weekly")
    return s


def next_times(schedule: str, start: dt.datetime, n: int = 3) -> list[dt.datetime]:
    it = croniter(schedule, start)
    return [it.get_next(dt.datetime) for _ in range(n)]


def tag_for(target: str, conf_dir: Path) -> str:
    return f"{TAG}:{target}:{conf_dir}"


def parse_tag(comment: str) -> tuple[str, str] | None:
    """(target, conf_dir) of one of our entries' comments; None for anything else."""
    parts = comment.split(":", 2)
    if len(parts) != 3 or parts[0] != TAG:
        return None
    return parts[1], parts[2]


def fire_command(*, target: str, python: str, repo: Path, conf_dir: Path, profile: str | None,
                 logs_dir: Path) -> str:
    """The shell line cron runs: everything absolute, every value quoted."""
    for what, value in (("python", python), ("repo", repo), ("conf", conf_dir), ("logs_dir", logs_dir)):
        if "%" in str(value) or "\n" in str(value):
            raise CronError(f"{what} path {str(value)!r} contains '%' or a newline, which crontab cannot carry; "
                            f"move it to a path without them")
        if not os.path.isabs(str(value)):
            raise CronError(f"{what} path {str(value)!r} is not absolute")
    q = shlex.quote
    venv_bin = str(Path(python).parent)
    env = {"PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": f"{repo}/py:{repo}",
           "EAGLELAB_CONF": str(conf_dir)}
    if profile:
        env["EAGLELAB_PROFILE"] = profile
    cron_dir = logs_dir / "cron"
    assigns = " ".join(f"{k}={q(v)}" for k, v in env.items())
    # umask 077: cron.out and the folder (made here, first) are this user's only, as the host's logs
    return (f"umask 077 && mkdir -p {q(str(cron_dir))} && cd {q(str(repo))} && {assigns} {q(python)} -m eaglelab.control.cli "
            f"cron fire --target {q(target)} >> {q(str(cron_dir / 'cron.out'))} 2>&1")


# -- the user's crontab -------------------------------------------------------------------------

@dataclass
class Entry:
    target: str
    conf_dir: str
    schedule: str
    command: str
    enabled: bool


def _crontab():
    from crontab import CronTab
    try:
        return CronTab(user=True)
    except (OSError, ValueError) as e:
        raise CronError(f"cannot read your crontab ({e}); is cron installed (`crontab -l` works)?") from None


def _write(tab) -> None:
    try:
        tab.write()
    except (OSError, ValueError) as e:
        raise CronError(f"cannot write your crontab ({e}); try `crontab -l` to see what is wrong") from None


def install(*, schedule: str, target: str, conf_dir: Path, profile: str | None, logs_dir: Path,
            python: str | None = None, repo: Path = REPO_ROOT) -> Entry:
    """Add (or replace) the entry of this target and conf dir."""
    schedule = check_schedule(schedule)
    python = python or os.path.abspath(sys.executable)  # the venv's python: not resolved (a symlink)
    command = fire_command(target=target, python=python, repo=Path(repo).resolve(), conf_dir=conf_dir,
                           profile=profile, logs_dir=logs_dir)
    private_dir(logs_dir / "cron")
    tab = _crontab()
    tag = tag_for(target, conf_dir)
    tab.remove_all(comment=tag)
    job = tab.new(command=command, comment=tag)
    job.setall(schedule)
    if not job.is_valid():
        raise CronError(f"--schedule {schedule!r}: python-crontab refuses it; give 5 fields, e.g. '0 3 * * *'")
    _write(tab)
    return Entry(target, str(conf_dir), schedule, command, True)


def entries() -> list[Entry]:
    out = []
    for job in _crontab():
        parsed = parse_tag(job.comment or "")
        if parsed:
            out.append(Entry(parsed[0], parsed[1], job.slices.render(), job.command, job.is_enabled()))
    return out


def remove(*, conf_dir: Path | None, target: str | None) -> list[Entry]:
    """Remove our entries (of this conf dir, or all when None; of one target or all)."""
    tab = _crontab()
    gone = []
    for job in list(tab):
        parsed = parse_tag(job.comment or "")
        if not parsed:
            continue
        if (target is None or parsed[0] == target) and (conf_dir is None or parsed[1] == str(conf_dir)):
            gone.append(Entry(parsed[0], parsed[1], job.slices.render(), job.command, job.is_enabled()))
            tab.remove(job)
    if gone:
        if not tab.render().strip():  # nothing left: no crontab at all, as before install (`crontab -r`)
            try:
                subprocess.run(["crontab", "-r"], check=True, capture_output=True, timeout=30)
            except (OSError, subprocess.SubprocessError) as e:
                raise CronError(f"cannot remove your (now empty) crontab ({e})") from None
        else:
            _write(tab)
    return gone


# -- one firing ---------------------------------------------------------------------------------

def new_firing_id(target: str, now: float | None = None) -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}-{target}-{secrets.token_hex(2)}"


class FiringLock:
    """An flock held for the whole firing, plus a note of who holds it (for the one turned away).

    flock belongs to the open file: when the holder dies, however it dies, the kernel drops it."""

    def __init__(self, locks_dir: Path):
        from filelock import FileLock
        locks_dir.mkdir(parents=True, exist_ok=True)
        self.lock = FileLock(str(locks_dir / "cron-firing.lock"))
        self.holder_file = locks_dir / "cron-firing.json"

    def try_acquire(self, holder: dict) -> bool:
        from filelock import Timeout
        try:
            self.lock.acquire(timeout=0)
        except Timeout:
            return False
        atomic_write_json(self.holder_file, {**holder, "pid": os.getpid(), "since": utcnow_iso()})
        return True

    def holder(self, wait_s: float = 2.0) -> dict:
        """Who holds the lock. The holder writes its note just after it got the lock: a firing
        turned away in that instant waits a moment for it."""
        deadline = time.time() + wait_s
        while True:
            note = read_json(self.holder_file)
            if note or time.time() > deadline:
                return note or {}
            time.sleep(0.05)

    def release(self) -> None:
        try:
            self.holder_file.unlink()
        except FileNotFoundError:
            pass
        self.lock.release()


def firings(logs_dir: Path, limit: int = 10) -> list[dict]:
    """The latest firings' summaries (<logs_dir>/cron/<firing>.json), newest first."""
    found = sorted((logs_dir / "cron").glob("*.json"), reverse=True)
    out = []
    for p in found:
        data = read_json(p)
        if isinstance(data, dict) and data.get("firing_id"):
            out.append(data)
        if len(out) >= limit:
            break
    return out


def point_latest(cron_dir: Path, log_path: Path) -> None:
    """<cron_dir>/latest.log -> this firing's log (replaced atomically)."""
    tmp = cron_dir / f".latest.{os.getpid()}"
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    os.symlink(log_path.name, tmp)
    os.replace(tmp, cron_dir / "latest.log")


def write_summary(cron_dir: Path, summary: dict) -> None:
    atomic_write_json(cron_dir / f"{summary['firing_id']}.json", {"schema": 1, **summary})


def summarize(steps: list, before: dict[str, str | None], after: dict[str, dict | None]) -> list[dict]:
    """Per planned stage: what the plan said and what happened (a new run, or none)."""
    out = []
    for s in steps:
        rec = after.get(s.stage)
        new = rec is not None and rec.get("id") != before.get(s.stage)
        if new:
            outcome = rec["state"]
        elif s.action == "attach" and rec:
            outcome = f"attached, {rec['state']}"
        elif s.action == "skip":
            outcome = "skipped"
        else:
            outcome = "not reached"
        out.append({"stage": s.stage, "planned": s.action, "reason": s.reason,
                    "run_id": rec.get("id") if rec else None, "outcome": outcome})
    return out


def firing_summary(*, firing_id: str, target: str, started: float, now: float, exit_code: int,
                   error: str | None, stages: list[dict], log: str) -> dict:
    """Pure: what <firing>.json records and the log's last line says."""
    ok = exit_code == 0
    ran = [s for s in stages if s["outcome"] not in ("skipped", "not reached")]
    bad = next((s for s in stages if s["outcome"].split(", ")[-1] in (RunState.FAILED, RunState.KILLED)), None)
    if ok:
        detail = f"ran {len(ran)}, skipped {sum(s['outcome'] == 'skipped' for s in stages)}"
    else:
        detail = error or (f"{bad['stage']} {bad['outcome']}" if bad else f"exit code {exit_code}")
    return {"firing_id": firing_id, "target": target, "started_at": utcnow_iso(started), "ended_at": utcnow_iso(now),
            "duration_s": round(now - started, 3), "exit_code": exit_code, "ok": ok, "detail": detail,
            "result": ("complete: " if ok else "stopped: ") + detail, "failed_stage": bad["stage"] if bad else None,
            "stages": stages, "log": log, "pid": os.getpid()}


def prune(cron_dir: Path, keep: int = KEEP_FIRINGS) -> list[str]:
    """Delete the logs and summaries of all but the newest `keep` firings; the firing ids removed.
    Firing ids start with their UTC time, so their names sort by age."""
    ids = sorted({p.name.rsplit(".", 1)[0] for p in cron_dir.glob("2*.log")} |
                 {p.name.rsplit(".", 1)[0] for p in cron_dir.glob("2*.json")})
    old = ids[:-keep] if keep > 0 else ids
    for firing_id in old:
        for ext in (".log", ".json"):
            try:
                (cron_dir / f"{firing_id}{ext}").unlink()
            except FileNotFoundError:
                pass
    return old
