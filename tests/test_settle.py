"""How a run stands or ended, decided in one place (eaglelab.host.settle): the table below is the
specification (docs/operations.md shows it in words), and over the whole table the run's state and
its log state agree. The real processes behind each fact (a killed jobwrap, an orphan, a lost
host, a Slurm job) are in tests/test_runs_lifecycle.py, test_slurm_lab.py and test_ssh_lab.py."""

from __future__ import annotations

import signal

import pytest

from eaglelab.control import notify
from eaglelab.control.registry import Registry
from eaglelab.host.settle import (
    END_STATES,
    Liveness,
    SlurmWord,
    agrees,
    at_launch,
    is_failure,
    settle,
    state_of,
    vanished,
)
from eaglelab.model import FINAL, RunState

STARTED = {"run_id": "t-1", "stage": "t", "started_at": "2026-12-04T10:00:00.000Z"}
NOT_STARTED = {"run_id": "t-1", "stage": "t", "started_at": None}
LAST = "2026-12-04T10:30:00.000Z"  # the run's last sign of life (heartbeat, the log's last write)

ALIVE = Liveness(wrapper_alive=True)
STARTING = Liveness(spawning=True)
ORPHAN = Liveness(stage_alive=True, last_sign_of_life=LAST)
GONE = Liveness(last_sign_of_life=LAST)
GONE_ASKED = Liveness(last_sign_of_life=LAST, stop_requested=True)
DAMAGED = Liveness(end_unknown="exit.json exists but cannot be read as JSON", last_sign_of_life=LAST)
ON_SLURM = Liveness(last_sign_of_life=LAST)  # a login node sees no process of the compute node

EXIT_0 = {"exit_code": 0, "signal": None, "state": "completed", "ended_at": LAST}
EXIT_3 = {"exit_code": 3, "signal": None, "state": "failed", "ended_at": LAST}
EXIT_KILL = {"exit_code": None, "signal": int(signal.SIGKILL), "state": "failed", "ended_at": LAST}
EXIT_TERM = {"exit_code": None, "signal": int(signal.SIGTERM), "state": "killed", "ended_at": LAST}
EXIT_OLD = {"exit_code": 2, "signal": None, "ended_at": LAST}  # an old jobwrap's record: no state in it

RUNNING_LOG = {"schema": 1, "state": "running", "last_line": "step 40/100", "failure": None}
STALLED_LOG = {"schema": 1, "state": "stalled", "stall": {"message": "no progress"}, "failure": None}
DONE_LOG = {"schema": 1, "state": "completed", "failure": None}
FAILED_LOG = {"schema": 1, "state": "failed", "failure": {"reason": "cuda_oom", "message": "CUDA out of memory"}}
KILLED_LOG = {"schema": 1, "state": "killed", "failure": None, "exit": {}}  # combined with a TERM's exit


def slurm(state=None, **kw):
    return SlurmWord(state=state, job_id="7", **kw)


# case, meta, exit.json, log state, liveness, Slurm's word -> state, flags set, log state, failure reason in the log
TABLE = [
    # -- the exit recorded: jobwrap decided it (eaglelab.model.decide_end) -------------------------
    ("exit 0", STARTED, EXIT_0, DONE_LOG, GONE, None, "completed", set(), "completed", None),
    ("exit 3", STARTED, EXIT_3, FAILED_LOG, GONE, None, "failed", set(), "failed", "cuda_oom"),
    ("SIGKILL nobody asked", STARTED, EXIT_KILL, None, GONE, None, "failed", set(), None, None),
    ("TERM (lab stop)", STARTED, EXIT_TERM, KILLED_LOG, GONE_ASKED, None, "killed", set(), "killed", None),
    ("an exit without a state", STARTED, EXIT_OLD, None, GONE, None, "failed", set(), None, None),
    ("exit recorded, jobwrap not out yet", STARTED, EXIT_0, DONE_LOG, ALIVE, None, "completed", set(), "completed", None),
    # -- no exit recorded ------------------------------------------------------------------------
    ("jobwrap alive", STARTED, None, RUNNING_LOG, ALIVE, None, "running", set(), "running", None),
    ("jobwrap alive, the log stalled", STARTED, None, STALLED_LOG, ALIVE, None, "running", set(), "stalled", None),
    ("jobwrap alive, the log names a failure", STARTED, None, FAILED_LOG, ALIVE, None, "running", set(), "failed", "cuda_oom"),
    ("jobwrap starting", NOT_STARTED, None, None, STARTING, None, "pending", set(), None, None),
    ("exit.json unreadable", STARTED, None, RUNNING_LOG, DAMAGED, None, "failed", {"end_unknown"}, "failed", None),
    ("wrapper gone, stage alive", STARTED, None, RUNNING_LOG, ORPHAN, None, "running", {"orphaned"}, "running", None),
    ("wrapper and stage gone", STARTED, None, RUNNING_LOG, GONE, None, "killed", {"lost"}, "killed", "lost"),
    ("lost, the log stalled", STARTED, None, STALLED_LOG, GONE, None, "killed", {"lost"}, "killed", "lost"),
    ("lost, no log", STARTED, None, None, GONE, None, "killed", {"lost"}, None, None),
    ("lost, the log says done", STARTED, None, DONE_LOG, GONE, None, "completed", {"adopted"}, "completed", None),
    ("lost, the log says failed", STARTED, None, FAILED_LOG, GONE, None, "failed", {"adopted"}, "failed", "cuda_oom"),
    ("lost after a stop asked", STARTED, None, RUNNING_LOG, GONE_ASKED, None, "killed", {"lost"}, "killed", "lost"),
    # -- a Slurm job: Slurm's word first ---------------------------------------------------------
    ("Slurm PENDING", NOT_STARTED, None, None, ON_SLURM, slurm("PENDING"), "pending", set(), None, None),
    ("Slurm RUNNING", STARTED, None, RUNNING_LOG, ON_SLURM, slurm("RUNNING"), "running", set(), "running", None),
    ("Slurm COMPLETING, exit recorded", STARTED, EXIT_TERM, KILLED_LOG, ON_SLURM, slurm("COMPLETING"),
     "running", set(), "killed", None),
    ("Slurm REQUEUED after an attempt", STARTED, EXIT_KILL, FAILED_LOG, ON_SLURM, slurm("REQUEUED"),
     "pending", set(), "failed", "cuda_oom"),
    ("Slurm COMPLETED, exit 0", STARTED, EXIT_0, DONE_LOG, ON_SLURM, slurm("COMPLETED"), "completed", set(), "completed", None),
    ("Slurm COMPLETED, no exit", STARTED, None, RUNNING_LOG, ON_SLURM, slurm("COMPLETED"), "completed", set(), "completed", None),
    ("Slurm FAILED, exit 3", STARTED, EXIT_3, FAILED_LOG, ON_SLURM, slurm("FAILED"), "failed", set(), "failed", "cuda_oom"),
    ("Slurm FAILED, slurm.out says OOM", STARTED, EXIT_3, FAILED_LOG, ON_SLURM, slurm("FAILED", oom_in_output=True),
     "failed", set(), "failed", "host_oom_killed"),
    ("Slurm OUT_OF_MEMORY", STARTED, EXIT_KILL, RUNNING_LOG, ON_SLURM, slurm("OUT_OF_MEMORY"), "failed", set(), "failed", "host_oom_killed"),
    ("Slurm TIMEOUT", STARTED, EXIT_TERM, KILLED_LOG, ON_SLURM, slurm("TIMEOUT"), "failed", set(), "failed", "time_limit"),
    ("Slurm DEADLINE", STARTED, None, None, ON_SLURM, slurm("DEADLINE"), "failed", set(), "failed", "time_limit"),
    ("Slurm NODE_FAIL", STARTED, None, RUNNING_LOG, ON_SLURM, slurm("NODE_FAIL"), "failed", set(), "failed", "node_fail"),
    ("Slurm BOOT_FAIL", NOT_STARTED, None, None, ON_SLURM, slurm("BOOT_FAIL"), "failed", set(), "failed", "node_fail"),
    # the bug this module fixed: killed at run level while the log state said failed
    ("Slurm PREEMPTED", STARTED, EXIT_TERM, KILLED_LOG, ON_SLURM, slurm("PREEMPTED"), "killed", set(), "killed", "preempted"),
    ("Slurm CANCELLED by someone", STARTED, None, RUNNING_LOG, ON_SLURM, slurm("CANCELLED"), "killed", set(), "killed", "cancelled"),
    ("Slurm CANCELLED by lab stop", STARTED, EXIT_TERM, KILLED_LOG, GONE_ASKED, slurm("CANCELLED"), "killed", set(), "killed", None),
    ("Slurm REVOKED", STARTED, None, None, ON_SLURM, slurm("REVOKED"), "killed", set(), "killed", "cancelled"),
    ("Slurm SPECIAL_EXIT", STARTED, None, None, ON_SLURM, slurm("SPECIAL_EXIT"), "failed", set(), "failed", "other"),
    ("Slurm, a state nobody knows", STARTED, None, None, ON_SLURM, slurm("SOMETHING_NEW"), "failed", set(), "failed", "other"),
    ("Slurm silent, not started", NOT_STARTED, None, None, ON_SLURM, slurm(), "pending", set(), None, None),
    ("Slurm silent, heartbeat fresh", STARTED, None, RUNNING_LOG, ON_SLURM, slurm(heartbeat_fresh=True), "running", set(), "running", None),
    ("Slurm did not answer", STARTED, None, RUNNING_LOG, ON_SLURM, slurm(error="squeue timed out"), "running", set(), "running", None),
    ("Slurm forgot it, heartbeat stale", STARTED, None, RUNNING_LOG, ON_SLURM, slurm(), "killed", {"lost"}, "killed", "lost"),
    ("Slurm forgot it, the log says done", STARTED, None, DONE_LOG, ON_SLURM, slurm(), "completed", {"adopted"}, "completed", None),
    ("Slurm silent, exit recorded", STARTED, EXIT_3, FAILED_LOG, ON_SLURM, slurm(), "failed", set(), "failed", "cuda_oom"),
]
FLAGS = ("lost", "orphaned", "adopted", "end_unknown")


@pytest.mark.parametrize("case,meta,exit_info,log,live,word,state,flags,log_state,reason", TABLE,
                         ids=[row[0] for row in TABLE])
def test_settle_decides_every_case(case, meta, exit_info, log, live, word, state, flags, log_state, reason):
    s = settle(meta, exit_info, log, live, word)
    assert s.state == state and isinstance(s.state, RunState)
    assert {f for f in FLAGS if getattr(s, f)} == flags
    assert (s.log_state or {}).get("state") == log_state
    assert ((s.log_state or {}).get("failure") or {}).get("reason") == reason
    if state in FINAL:
        assert s.ended_at is not None or word is not None and exit_info is None  # Slurm gives no end time here
    else:
        assert s.ended_at is None or state == "running" and exit_info is not None  # COMPLETING keeps jobwrap's


@pytest.mark.parametrize("case,meta,exit_info,log,live,word", [r[:6] for r in TABLE], ids=[r[0] for r in TABLE])
def test_run_state_and_log_state_agree_over_the_whole_table(case, meta, exit_info, log, live, word):
    """An ended run's log state says the same end: for every row, and for every log state the
    parser can give beside it (so no end depends on which log state the row happened to carry)."""
    for any_log in (log, None, RUNNING_LOG, STALLED_LOG, DONE_LOG, FAILED_LOG, KILLED_LOG):
        s = settle(meta, exit_info, any_log, live, word)
        assert agrees(s.state, s.log_state), (case, any_log, s)


def test_the_table_covers_every_slurm_end_state_and_every_run_state():
    covered = {row[5].state for row in TABLE if row[5] is not None}
    assert set(END_STATES) <= covered
    assert {row[6] for row in TABLE} == set(RunState)


def test_settle_never_changes_the_log_state_it_was_given():
    log = dict(RUNNING_LOG)
    settle(STARTED, None, log, GONE, None)
    settle(STARTED, None, log, ON_SLURM, slurm("PREEMPTED"))
    assert log == RUNNING_LOG


# -- the answers the controller carries: it never decides a run's state itself --------------------

def test_what_counts_as_a_failure_for_the_notifications():
    """failed, or lost without a stop asked; a stop, a TERM, a preemption or a cancel is not."""
    for case, meta, exit_info, log, live, word, *_ in TABLE:
        s = settle(meta, exit_info, log, live, word)
        run = {**s.fields(), "stop_requested": live.stop_requested}
        expect = s.state == "failed" or (s.state == "killed" and s.lost and not live.stop_requested)
        assert is_failure(run) == expect, case
        ends = [e for e in notify.events_for({"state": "running"}, run) if e != "stalled"]
        assert ends == (
            ["completed"] if s.state == "completed" else ["failed"] if expect else []), case


def test_a_launch_a_record_without_a_state_and_a_vanished_run():
    assert at_launch({"started_at": None}) is RunState.PENDING
    assert at_launch(STARTED) is RunState.RUNNING
    assert state_of({"state": "failed"}) is RunState.FAILED
    assert state_of({"state": None, "ended_at": LAST}) is RunState.KILLED
    assert state_of({"state": None}) is RunState.PENDING and state_of({"state": "bogus"}) is RunState.PENDING
    gone = vanished({"id": "t-1", "state": "running", "log_state": dict(RUNNING_LOG)}, "its directory is gone", LAST)
    assert (gone["state"], gone["lost"], gone["end_unknown"]) == ("killed", True, "its directory is gone")
    assert agrees(gone["state"], gone["log_state"])


def test_the_registry_stores_settle_s_answer_for_a_row_without_a_state(tmp_path):
    reg = Registry(tmp_path / "registry.sqlite")
    reg.upsert_many([{"id": "a-1", "stage": "a", "host": "h", "state": None, "ended_at": LAST},
                     {"id": "b-1", "stage": "b", "host": "h", "state": None}])
    assert (reg.get("a-1")["state"], reg.get("b-1")["state"]) == ("killed", "pending")
