"""How a run stands, or how it ended: decided once, here on the host, by `settle`.

Every case lives in this one function (the table: docs/operations.md "How a run's state is
decided"; tests/test_settle.py is the same table as a test):

- an exit recorded (exit.json)     -> its state (jobwrap decided it by eaglelab.model.decide_end)
- jobwrap alive                    -> running
- exit.json there but unreadable   -> failed, `end_unknown` (never rerun without a person's word)
- not started, jobwrap starting    -> pending
- wrapper gone, the stage lives    -> running, `orphaned`
- wrapper and stage gone           -> killed, `lost` at its last sign of life; `adopted` instead
                                      when the log says how it ended (completed / failed)
- a Slurm job                      -> Slurm's word first (queue states, END_STATES via map_end,
                                      a requeued job pending again), the heartbeat when Slurm says nothing

and the log state is made to agree: an ended run's log state says the same end (a preempted job is
`killed` in both). Readers (hostside.read_run, slurmside, the registry, notify) carry the answer;
the controller never decides a run's state again. Pure: the callers gather the facts (files,
processes, Slurm's answer) and act on the answer (record an end, follow an orphan). Its records are
immutable NamedTuples (as model.Ending): made in a tenth of a frozen dataclass's import time, and
every `lab status` imports this module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from eaglelab.model import ACTIVE, FINAL, Run, RunState, StageState, decide_end

# Slurm's end state -> (our run state, failure reason or None). The one table; tests/test_slurm_states.py
# checks every row. COMPLETED, FAILED and CANCELLED defer to jobwrap's exit.json when there is one.
END_STATES: dict[str, tuple[RunState, str | None]] = {
    "COMPLETED": (RunState.COMPLETED, None),
    "FAILED": (RunState.FAILED, None),
    "OUT_OF_MEMORY": (RunState.FAILED, "host_oom_killed"),
    "TIMEOUT": (RunState.FAILED, "time_limit"),  # the job ran past its time limit (slurmstepd: DUE TO TIME LIMIT)
    "DEADLINE": (RunState.FAILED, "time_limit"),
    "NODE_FAIL": (RunState.FAILED, "node_fail"),
    "BOOT_FAIL": (RunState.FAILED, "node_fail"),
    "PREEMPTED": (RunState.KILLED, "preempted"),
    "CANCELLED": (RunState.KILLED, "cancelled"),
    "REVOKED": (RunState.KILLED, "cancelled"),
    "SPECIAL_EXIT": (RunState.FAILED, "other"),
}
# Slurm states of a job not yet ended -> our run state.
_P, _R = RunState.PENDING, RunState.RUNNING
ACTIVE_STATES: dict[str, RunState] = {
    "PENDING": _P, "REQUEUED": _P, "REQUEUE_HOLD": _P, "REQUEUE_FED": _P, "CONFIGURING": _P, "RESV_DEL_HOLD": _P,
    "POWER_UP_NODE": _P, "SUSPENDED": _R, "STOPPED": _R, "RUNNING": _R, "COMPLETING": _R, "SIGNALING": _R,
    "STAGE_OUT": _R, "RESIZING": _R, "UPDATE_DB": _R,
}
# Without cgroups (jobacct_gather's OverMemoryKill) a job over --mem ends FAILED, and slurmstepd says so in slurm.out.
OOM_TEXT = re.compile(rb"exceeded (job )?memory limit|oom[-_ ]kill", re.I)


class Liveness(NamedTuple):
    """What was seen of a run's processes and files (hostside gathers it; settle judges it)."""

    wrapper_alive: bool = False       # jobwrap of this very run directory lives
    spawning: bool = False            # jobwrap spawned and still starting (its process lives, or the grace runs)
    stage_alive: bool = False         # processes of the stage's group live, proved ours (EAGLELAB_RUN_DIR)
    end_unknown: str | None = None    # exit.json is there but unreadable: what is wrong with it
    stop_requested: bool = False      # `lab stop` asked (the run directory's stop_requested file)
    last_sign_of_life: str | None = None  # the heartbeat's or the log's last write: a lost run's end


class SlurmWord(NamedTuple):
    """What Slurm said of a run's job (slurmside gathers it: squeue, scontrol/sacct, slurm_end.json)."""

    state: str | None = None          # Slurm's JobState; None: no word (not asked, or forgotten)
    reason: str | None = None         # Slurm's reason for it
    job_id: str | None = None
    ended_at: str | None = None
    error: str | None = None          # Slurm did not answer: keep the run as it was, never call it lost
    heartbeat_fresh: bool = False     # jobwrap's heartbeat is recent (the compute node is not visible here)
    oom_in_output: bool = False       # slurm.out has slurmstepd's "exceeded memory limit"


class Settled(NamedTuple):
    """settle's answer: the fields of a run record that say how it stands or ended."""

    state: RunState
    ended_at: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    lost: bool = False            # wrapper and stage gone, the end unrecorded (killed, end unknown)
    orphaned: bool = False        # the wrapper died, the stage lives on (running, unsupervised)
    adopted: bool = False         # a lost run whose log said how it ended
    orphans: bool = False         # processes of the stage's group outlived its end
    end_unknown: str | None = None
    log_state: dict[str, Any] | None = None

    def fields(self) -> dict[str, Any]:
        """For a run record: the fields every record carries, and the flags only when they are set
        (a record has always carried `lost`, the others only when true)."""
        out = {"state": self.state, "lost": self.lost, "ended_at": self.ended_at, "exit_code": self.exit_code,
               "signal": self.signal, "log_state": self.log_state}
        for flag in ("orphaned", "adopted", "orphans", "end_unknown"):
            if getattr(self, flag):
                out[flag] = getattr(self, flag)
        return out


def exit_state(exit_info: Mapping, stop_requested: bool = False) -> RunState:
    """The state an exit record carries; decided by the one rule when it carries none (an old jobwrap)."""
    state = exit_info.get("state")
    if state in RunState._value2member_map_:
        return RunState(state)
    return decide_end(exit_info.get("exit_code"), exit_info.get("signal"),
                      stop_requested=bool(exit_info.get("stop_requested")) or stop_requested,
                      outputs_done=bool(exit_info.get("outputs_done"))).state


def map_end(slurm_state: str, exit_info: Mapping | None, stop_requested: bool,
            oom_in_output: bool = False) -> tuple[RunState, str | None]:
    """(our state, failure reason) for a job Slurm says has ended. jobwrap's exit.json decides a
    plain COMPLETED/FAILED/CANCELLED; Slurm decides when it ended the job itself."""
    state, reason = END_STATES.get(slurm_state, (RunState.FAILED, "other"))
    if slurm_state == "FAILED" and oom_in_output:
        return RunState.FAILED, "host_oom_killed"
    if slurm_state in ("COMPLETED", "FAILED", "CANCELLED") and exit_info is not None:
        state, reason = exit_state(exit_info, stop_requested), None
    if slurm_state == "CANCELLED" and stop_requested:
        return RunState.KILLED, None  # `lab stop`: killed on purpose, no failure
    return state, reason


def settle(meta: Mapping, exit_info: Mapping | None, log_state: Any, liveness: Liveness,
           slurm: SlurmWord | None = None) -> Settled:
    """How the run of meta.json stands or ended, from its exit record (None: none readable), its log
    state (the state JSON combined with the exit; anything not a dict: none), what lives of it, and
    Slurm's word on its job (None: not a Slurm job)."""
    a = _host_answer(meta, exit_info, liveness)
    failure = None  # (reason, message) that Slurm gave for the end
    if slurm is not None:
        a, failure = _slurm_answer(a, meta, exit_info, liveness, slurm)
    ls = log_state if isinstance(log_state, dict) else None
    if a["lost"] and ls and ls.get("state") in (RunState.COMPLETED, RunState.FAILED):
        # the wrapper died with the end unrecorded, but the log says how the stage ended
        a.update(state=RunState(ls["state"]), lost=False, adopted=True)
    a["log_state"] = agreeing_log(ls, a["state"], lost=a["lost"], failure=failure)
    return Settled(**a)


def _host_answer(meta: Mapping, exit_info: Mapping | None, live: Liveness) -> dict:
    a: dict[str, Any] = {"state": RunState.RUNNING, "ended_at": None, "exit_code": None, "signal": None,
                         "lost": False, "orphaned": False, "orphans": False, "end_unknown": None}
    if exit_info is not None:
        a.update(state=exit_state(exit_info, live.stop_requested), ended_at=exit_info.get("ended_at"),
                 exit_code=exit_info.get("exit_code"), signal=exit_info.get("signal"),
                 orphans=bool(exit_info.get("orphans", False)))
    elif live.wrapper_alive:
        pass  # running (jobwrap records the end when there is one)
    elif live.end_unknown is not None:
        # the run ended, how is unknown: failed with that said, never rerun without a person's word
        a.update(state=RunState.FAILED, end_unknown=live.end_unknown, ended_at=live.last_sign_of_life)
    elif not meta.get("started_at") and live.spawning:
        a.update(state=RunState.PENDING)  # jobwrap is still starting, however slowly
    elif live.stage_alive:
        # the wrapper died (kill -9, OOM) but the stage lives on, unsupervised: still running,
        # never launched again while alive, stoppable (hostside.stop records its end)
        a.update(orphaned=True)
    else:
        # wrapper and stage gone, the end unrecorded: it ended at its last sign of life, so its
        # duration stops growing
        a.update(state=RunState.KILLED, lost=True, ended_at=live.last_sign_of_life)
    return a


def _slurm_answer(a: dict, meta: Mapping, exit_info: Mapping | None, live: Liveness,
                  sl: SlurmWord) -> tuple[dict, tuple[str, str] | None]:
    """The host's answer corrected by Slurm's word: Slurm knows the job; the login node sees none
    of the compute node's processes, only the files on the shared work dir."""
    a = {**a, "orphaned": False}
    if sl.state in ACTIVE_STATES:
        ours = ACTIVE_STATES[sl.state]
        if exit_info is None or ours is RunState.PENDING:  # requeued: the earlier attempt's end is history
            a.update(state=ours, lost=False, end_unknown=None, ended_at=None, exit_code=None, signal=None)
        else:
            # jobwrap has recorded its end but Slurm has not (COMPLETING): Slurm may yet call it
            # TIMEOUT, OUT_OF_MEMORY or PREEMPTED, so the run is not over until Slurm says so
            a.update(state=RunState.RUNNING)
        return a, None
    if sl.state:
        ours, reason = map_end(sl.state, exit_info, live.stop_requested, sl.oom_in_output)
        a.update(state=ours, lost=False, ended_at=a["ended_at"] or sl.ended_at)
        if reason:
            why = f" ({sl.reason})" if sl.reason not in (None, "None") else ""
            return a, (reason, f"Slurm: job {sl.job_id} ended {sl.state}{why}")
        return a, None
    if exit_info is None and live.end_unknown is None:
        # no word from Slurm (it did not answer, or forgot the job): the run directory alone, by
        # the heartbeat (the compute node's processes are not visible from here)
        if not meta.get("started_at"):
            a.update(state=RunState.PENDING, lost=False, ended_at=None)
        elif sl.heartbeat_fresh or sl.error:  # alive by its heartbeat, or Slurm silent: never call it lost
            a.update(state=RunState.RUNNING, lost=False, ended_at=None)
        else:
            a.update(state=RunState.KILLED, lost=True, ended_at=a["ended_at"] or live.last_sign_of_life)
    return a, None


def agreeing_log(ls: dict | None, state: RunState, *, lost: bool = False,
                 failure: tuple[str, str] | None = None) -> dict | None:
    """The log state made to agree with the run's: an ended run's log state says the same end
    (`state`), with Slurm's failure (`failure`: reason, message) when Slurm ended it, and a lost
    run's log says so instead of "running" forever. A live run's log state is the parser's own
    (it may name a failure, or stall, before the process ends)."""
    if state in ACTIVE:
        return ls
    if failure is not None:
        ls = dict(ls or {"schema": 1})
        prev = ls.get("failure") or {}
        ls["failure"] = {"reason": failure[0], "message": failure[1], "line": None,
                         **({"log_message": prev.get("message")} if prev.get("message") else {})}
    if ls is None:
        return None
    if lost and ls.get("state") in (RunState.RUNNING, StageState.STALLED):
        # A silent death: the process is gone and the log just stops, no exit line, no exit
        # status. Said as such, with the last line it wrote (what it was doing when it died).
        last = ls.get("last_line")
        ls = {**ls, "lost": True, "failure": ls.get("failure") or {
            "reason": "lost", "line": ls.get("last_line_no"), "process": None,
            "message": "the process is gone and its log ends with no exit line"
                       + (f"; last line: {last}" if last else "; the log is empty")}}
    if ls.get("state") != state:
        ls = {**ls, "state": state.value, "stall": None}
    return ls


def agrees(run_state: str, log_state: Any) -> bool:
    """The invariant settle keeps: an ended run's log state (when there is one) says the same end."""
    if run_state not in FINAL or not isinstance(log_state, dict):
        return True
    return log_state.get("state") == run_state


# -- the answers the controller carries ------------------------------------------------------------

def at_launch(meta: Mapping) -> RunState:
    """A run as its launch answered: running once jobwrap started the stage, else pending."""
    return RunState.RUNNING if meta.get("started_at") else RunState.PENDING


def state_of(record: Mapping) -> RunState:
    """The state a record carries; for one that carries none (an older host's answer, a row written
    by hand): ended (killed, end unknown) when it has an end time, else pending."""
    state = record.get("state")
    if state in RunState._value2member_map_:
        return RunState(state)
    return RunState.KILLED if state is None and record.get("ended_at") else RunState.PENDING


def vanished(record: Mapping, why: str, now_iso: str) -> dict:
    """A live run that its host confirmed it no longer has (the directory gone or unreadable): ended
    killed, lost, the reason in `end_unknown` (so it is not run again unasked: `lab run --force`)."""
    ls = record.get("log_state")
    return {**record, "state": RunState.KILLED, "lost": True, "orphaned": False, "ended_at": now_iso,
            "end_unknown": why, "log_state": {**ls, "state": RunState.KILLED.value, "stall": None, "lost": True}
            if isinstance(ls, dict) else ls}


def is_failure(run: Mapping | Run) -> bool:
    """Whether an ended run ended in a way nobody asked for: failed, or lost (the wrapper vanished,
    its end unknown: a failure until shown otherwise) without a stop asked. A `killed` on request,
    by TERM/INT, or by Slurm (preempted, cancelled) is not. (A record or the typed run: the
    registry's rows are records, notify's runs typed.)"""
    if isinstance(run, Run):
        state, lost, stop = run.state, run.lost, run.stop_requested
    else:
        state, lost, stop = run.get("state"), run.get("lost"), run.get("stop_requested")
    return state == RunState.FAILED or (state == RunState.KILLED and bool(lost) and not stop)
