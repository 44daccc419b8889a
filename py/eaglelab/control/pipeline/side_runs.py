"""Start and follow the side jobs of one `lab pipeline` (eaglelab.side_jobs says which and when).

While the pipeline waits on a run, `poll` starts each side job whose trigger is met (the stage it runs
beside has made enough units), once per pipeline, through `Lab.run(wait=False)`: idempotent like
any run (a pilot that is up to date is skipped, a running one attached to). It follows them and says
at once when one ends; a failed smoke is the next stage's failure, found early (the registry's
`failed` event carries it to the webhooks, the page and `lab status` show it).

Before the pipeline starts stage S, `before(S)` waits for a smoke of S (or of a service S needs)
still running and refuses to start S when that smoke failed under this very config (the same
fingerprint): hours of S would fail the same way. The side jobs still running when the pipeline
completes are waited for.
"""

from __future__ import annotations

import time
from typing import TextIO

from eaglelab import side_jobs
from eaglelab.errors import EaglelabError
from eaglelab.fsutil import parse_iso
from eaglelab.model import ACTIVE, RunState, how_it_ended

POLL_S = 2.0


class SideRuns:
    def __init__(self, lab, out: TextIO | None, clock=time.monotonic):
        self.lab, self.out, self.clock = lab, out, clock
        self.names = side_jobs.side_jobs(lab.cfg)
        self.started: dict[str, dict] = {}  # name -> its run record (id None: up to date, not run)
        self.ended: set[str] = set()
        self.watched: dict[str, str] = {}  # side job -> the run it was waiting on, seen active
        self.missed: set[str] = set()      # its window passed between two polls: said once
        self.next_at = 0.0

    def say(self, text: str) -> None:
        if self.out is not None:
            print(f"lab: {text}", file=self.out, flush=True)

    # -- starting ----------------------------------------------------------------------------

    def poll(self, current: dict | None = None, force: bool = False) -> None:
        """Start what is due and report what ended; cheap when called often (every POLL_S at most)."""
        if not self.names or (not force and self.clock() < self.next_at and not self._due_on(current)):
            return
        self.next_at = self.clock() + POLL_S
        for name in self.names:
            if name in self.started:
                continue
            beside = self.lab.cfg.stage(name).during.stage
            trigger = current if current and current.get("stage") == beside else self.lab.latest(beside)
            if side_jobs.due(self.lab.cfg, name, trigger):
                self.start(name, trigger)
            elif trigger and trigger.get("state") in ACTIVE:
                self.watched[name] = trigger["id"]
            elif trigger and self.watched.get(name) == trigger.get("id") and name not in self.missed:
                self.missed.add(name)  # too fast to be watched: nothing left to try early
                self.say(f"side job {name} not run: {trigger['stage']} ended before it was seen to have made "
                         f"{side_jobs.after_units(self.lab.cfg, self.lab.cfg.stage(name))} unit(s), "
                         f"and it is worth running only beside {trigger['stage']}")
        self.follow()

    def awaited_beside(self, stage: str) -> bool:
        """A side job still to start beside this stage: its trigger is a count of units, seen only
        by asking, so the wait keeps asking often (lab.Lab.wait)."""
        return any(n not in self.started and self.lab.cfg.stage(n).during.stage == stage for n in self.names)

    def _due_on(self, current: dict | None) -> bool:
        """A side job due on the run the pipeline waits on: a check of the record it has just read, no I/O,
        so it is made at every wait step, not every POLL_S (a short extraction's window is seconds)."""
        if not current:
            return False
        return any(n not in self.started and self.lab.cfg.stage(n).during.stage == current.get("stage")
                   and side_jobs.due(self.lab.cfg, n, current) for n in self.names)

    def start(self, name: str, trigger: dict) -> None:
        s = self.lab.cfg.stage(name)
        made = side_jobs.progress_units(trigger)
        why = (f"{s.during.stage} has made {made:.0f} unit(s)" if trigger.get("state") in ACTIVE
               else f"{s.during.stage} is done")
        self.say(f"starting side job {name} beside {s.during.stage} ({why})")
        try:
            # forced: a side job is a cheap check of what is there now (its script skips finished steps)
            rec = self.lab.run(name, force=True, wait=False, out=self.out or _Null(), reap=False)
        except EaglelabError as e:  # could not start (preflight, a host away): as good as a failed run
            rec = {"id": None, "stage": name, "host": s.host, "state": RunState.FAILED, "error": str(e)}
            self.say(f"side job {name} could not start: {e}")
            self.ended.add(name)
        self.started[name] = rec

    # -- following ---------------------------------------------------------------------------

    def follow(self) -> None:
        live = {n: r for n, r in self.started.items() if n not in self.ended and r.get("id")}
        if not live:
            return
        self.lab.refresh(sorted({r["host"] for r in live.values()}))
        for name, rec in live.items():
            cur = self.lab.registry.get(rec["id"]) or rec
            self.started[name] = cur
            if cur["state"] not in ACTIVE:
                self.ended.add(name)
                self.report(name, cur)

    def report(self, name: str, run: dict) -> None:
        s = self.lab.cfg.stage(name)
        if run["state"] == RunState.COMPLETED:
            self.say(f"side job {name} completed ({run['id']})"
                     + (f": {s.smoke_of} will start from a command that ran" if s.smoke_of else ""))
            return
        why = failure_of(run)
        if s.smoke_of:
            self.say(f"{s.smoke_of} WILL FAIL: its smoke test {run['id']} {run['state']} while "
                     f"{s.during.stage} runs: {why}. `lab logs {run['id']}` shows it; {s.during.stage} goes on")
        else:
            self.say(f"side job {name} {run['state']} ({run['id']}): {why}; `lab logs {run['id']}`")

    def running(self) -> list[str]:
        return [n for n, r in self.started.items() if n not in self.ended and r.get("id")]

    # -- the pipeline's questions --------------------------------------------------------------

    def before(self, stage: str) -> list[str]:
        """Why `stage` must not start now ([] = it may): its smoke, or the smoke of a service it needs
        (serve_eval's, for eval), failed under this config."""
        why = []
        for of in [stage, *self.lab.cfg.stage(stage).needs]:
            failed = self._smoke_failed(of)
            if failed:
                why.append(("its smoke test " if of == stage else f"the smoke test of {of}, which it needs, ")
                           + failed)
        return why

    def _smoke_failed(self, of: str) -> str | None:
        """How the smoke of stage `of` failed under this config (after waiting for it), or None."""
        smoke = side_jobs.smoke_name(of)
        if smoke not in self.lab.cfg.stages:
            return None
        if smoke in self.running():
            self.say(f"waiting for {smoke} before starting what needs {of}" if self.lab.cfg.stage(of).kind == "service"
                     else f"waiting for {smoke} before starting {of}")
            while smoke in self.running():
                time.sleep(POLL_S)
                self.follow()
        latest = self.lab.latest(smoke)
        if not latest or latest["state"] == RunState.COMPLETED or latest["state"] in ACTIVE:
            return None
        mine = self.lab.latest(of)
        if mine and (parse_iso(mine.get("started_at")) or 0) > (parse_iso(latest.get("ended_at")) or 0):
            return None  # the stage itself ran since: its own result says more than the smoke's
        if smoke not in self.started:  # a failure of an earlier pipeline counts only under this config
            try:
                if latest.get("fingerprint") != self.lab.fingerprint(self.lab.cfg.stage(smoke)):
                    return None
            except EaglelabError:
                return None
        return (f"{latest['id']} {latest['state']} with this config: {failure_of(latest)}; "
                f"fix it (`lab logs {latest['id']}`), then run the pipeline again")

    def finish(self) -> None:
        """The pipeline completed: wait for the side jobs still running (their figures are its)."""
        while self.running():
            names = self.running()
            self.say(f"waiting for side job(s) {', '.join(names)}")
            while set(names) & set(self.running()):
                time.sleep(POLL_S)
                self.follow()


def failure_of(run: dict) -> str:
    """The run's failure in one line: a launch error, else how it ended (the parsed failure, else
    its exit; the same words the notifications use), else its state."""
    return str(run.get("error") or how_it_ended(run) or run.get("state"))[:400]


class _Null:
    def write(self, s):
        return len(s)

    def flush(self):
        pass
