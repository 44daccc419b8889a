"""Services nobody uses any more: found, shown, and stopped after their keep-alive.

A service (a vLLM server) is started for the jobs that `need` it. Once none of them runs, it is
idle: it still holds its host's GPUs. An idle service is stopped when it has been idle for its
`keep_alive_s` (stages.NAME.keep_alive_s, 600 s by default: `make synth eval_baseline` keeps the
server between the two), whoever started it. `lab pipeline` stops a service as soon as no job left
in the pipeline needs it; `lab run` leaves a detached `lab services --reap --after S` behind, so the
stop happens even when nobody is watching; `lab web` reaps on every refresh.

A service is *in use* while any stage that `needs` it has a live run, whichever controller started
it (another pipeline, a cron firing, a job left running by a Ctrl-C): nothing here, nor
`lab pipeline` however it ends, stops a service in use (`in_use`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import TextIO

from eaglelab.fsutil import parse_iso, utcnow_iso
from eaglelab.model import ACTIVE


def users_of(lab, name: str) -> list[str]:
    """The stages that `need` service `name`."""
    return [n for n, s in lab.cfg.stages.items() if name in s.needs]


def in_use(lab, name: str) -> list[dict]:
    """The live runs (pending or running) of the stages that need service `name`, as the registry
    has them: whoever started them. Refresh the hosts first (`refresh_for`) to ask them."""
    return [r for n in users_of(lab, name) if (r := lab.latest(n)) and r["state"] in ACTIVE]


def refresh_for(lab, names: list[str]) -> dict[str, str | None]:
    """Ask the hosts of these services and of every stage that needs them (one round trip each):
    a run another controller started is known to its host, not necessarily to our registry."""
    hosts = {lab.cfg.stage(n).host for n in names} | {lab.cfg.stage(u).host for n in names for u in users_of(lab, n)}
    return lab.refresh([h for h in lab.cfg.hosts if h in hosts]) if hosts else {}


def usage(lab, now: float | None = None) -> list[dict]:
    """Every running service: in use (by which jobs) or idle (since when, stops when), GPUs held."""
    now = time.time() if now is None else now
    out = []
    for name, svc in lab.cfg.stages.items():
        if svc.kind != "service":
            continue
        rec = lab.latest(name)
        if not rec or rec["state"] not in ACTIVE:
            continue
        users = users_of(lab, name)
        busy = [r["stage"] for r in in_use(lab, name)]
        started = parse_iso(rec.get("started_at")) or now
        ends = [parse_iso((lab.latest(n) or {}).get("ended_at")) for n in users]
        idle_since = max([started, *[e for e in ends if e is not None and e >= started]])
        entry = {"service": name, "run": rec["id"], "host": svc.host, "gpus": svc.gpus, "needed_by": users,
                 "in_use_by": busy, "keep_alive_s": svc.keep_alive_s}
        if not busy:
            entry.update(idle_since=utcnow_iso(idle_since), idle_s=round(now - idle_since, 1),
                         stops_in_s=round(max(0.0, svc.keep_alive_s - (now - idle_since)), 1),
                         stops_at=utcnow_iso(idle_since + svc.keep_alive_s))
        out.append(entry)
    return out


def reap(lab, out: TextIO, now: float | None = None, keep=lambda name: False) -> list[str]:
    """Stop every service idle for longer than its keep-alive; the names stopped."""
    now = time.time() if now is None else now
    stopped = []
    for u in usage(lab, now):
        if u["in_use_by"] or keep(u["service"]) or u["stops_in_s"] > 0:
            continue
        gpus = f", freeing {u['gpus']} GPU(s) on {u['host']}" if u["gpus"] else ""
        print(f"lab: stopping service {u['service']} ({u['run']}): idle for {u['idle_s']:.0f} s, "
              f"keep_alive_s {u['keep_alive_s']:.0f}{gpus}", file=out)
        lab.stop(u["run"])
        stopped.append(u["service"])
    return stopped


def reap_later(lab, after_s: float) -> None:
    """A detached `lab services --reap --after S`: the keep-alive ends even if this process does."""
    log = lab.cfg.logs_dir / "services-reap.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "eaglelab.control.cli", "--conf", str(lab.cfg.conf_dir),
            "--profile", lab.cfg.profile, "services", "--reap", "--after", f"{after_s:.0f}"]
    with open(log, "ab") as f:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})


def reap_until_none_idle(lab, after_s: float, out: TextIO) -> None:
    """`lab services --reap --after S`: wait, reap; while services stay idle, wait for the next one;
    while one is in use (a job left running by a Ctrl-C of `lab pipeline`), look again now and then
    (every keep_alive_s, 30 s at most), so that it is stopped once idle past its keep-alive too."""
    time.sleep(max(0.0, after_s))
    (lab.cfg.logs_dir / "locks").mkdir(parents=True, exist_ok=True)
    # one reaper polls at a time (it watches every service until none runs); others wait their turn
    from filelock import FileLock  # ~20 ms to import (asyncio): only the reaper takes this lock

    with FileLock(str(lab.cfg.logs_dir / "locks" / "services-reap.lock")):
        while True:
            lab.refresh()
            reap(lab, out)
            rows = usage(lab)
            waits = [u["stops_in_s"] + 1 if not u["in_use_by"] else min(30.0, u["keep_alive_s"]) for u in rows]
            if not waits:
                return
            time.sleep(max(1.0, min(waits)))


def schedule_reap(lab) -> None:
    """After a job: if a service is idle now, come back when its keep-alive has passed."""
    idle = [u for u in usage(lab) if not u["in_use_by"]]
    if idle:
        reap_later(lab, min(u["stops_in_s"] for u in idle) + 1)
