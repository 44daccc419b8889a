"""Slurm's end states mapped to ours (eaglelab.host.slurmside.END_STATES), row by row, and merged
with the run directory. Pure: the live cluster tests (tests/test_slurm_lab.py) cover the states a
single-node test cluster can produce; this covers every row, including those it cannot
(PREEMPTED, BOOT_FAIL, DEADLINE, REVOKED)."""

from __future__ import annotations

import json

import pytest

from eaglelab.fsutil import parse_iso
from eaglelab.host import slurmside
from eaglelab.model import RunState

ROWS = [
    # slurm state, exit.json state (None: no exit.json), lab stop asked -> our state, failure reason
    ("COMPLETED", "completed", False, "completed", None),
    ("COMPLETED", None, False, "completed", None),
    ("FAILED", "failed", False, "failed", None),
    ("OUT_OF_MEMORY", "killed", False, "failed", "host_oom_killed"),
    ("TIMEOUT", "killed", False, "failed", "timeout"),
    ("DEADLINE", None, False, "failed", "timeout"),
    ("NODE_FAIL", None, False, "failed", "node_fail"),
    ("BOOT_FAIL", None, False, "failed", "node_fail"),
    ("PREEMPTED", "killed", False, "killed", "preempted"),
    ("CANCELLED", "killed", True, "killed", None),       # lab stop
    ("CANCELLED", None, False, "killed", "cancelled"),   # scancel by someone else
    ("REVOKED", None, False, "killed", "cancelled"),
    ("SPECIAL_EXIT", None, False, "failed", "other"),
    ("SOMETHING_NEW", None, False, "failed", "other"),   # a state this table does not know
]


@pytest.mark.parametrize("slurm_state,exit_state,stop,state,reason", ROWS, ids=[f"{r[0]}-{r[1]}-{r[2]}" for r in ROWS])
def test_every_end_state_maps_to_ours(slurm_state, exit_state, stop, state, reason):
    exit_info = {"state": exit_state} if exit_state else None
    assert slurmside.map_end(slurm_state, exit_info, stop, b"") == (state, reason)
    assert state in set(RunState)


def test_the_table_covers_every_documented_end_state():
    assert {r[0] for r in ROWS} >= set(slurmside.END_STATES)


def test_failed_with_the_oom_text_in_slurm_out_is_host_oom_killed():
    out = b"slurmstepd: error: Job 7 exceeded memory limit (1200 > 1024), being killed"
    assert slurmside.map_end("FAILED", {"state": "failed"}, False, out) == ("failed", "host_oom_killed")


def _run_dir(tmp_path, exit_state=None):
    d = tmp_path / "runs" / "t-20261202T000000-abcd"
    d.mkdir(parents=True)
    (d / "slurm.json").write_text(json.dumps({"job_id": "7", "partition": "gpu", "submitted_at": "2026-12-02T00:00:00.000Z"}))
    if exit_state:
        (d / "exit.json").write_text(json.dumps({"state": exit_state, "exit_code": None, "signal": 15}))
    return d


def test_a_run_is_not_over_while_slurm_still_has_the_job(tmp_path):
    """jobwrap recorded a TERM (the time limit's), Slurm is still COMPLETING: running until Slurm
    says TIMEOUT, never a transient `killed`."""
    d = _run_dir(tmp_path, "killed")
    rec = {"id": d.name, "stage": "t", "host": "hpc", "state": "killed", "started_at": "2026-12-02T00:00:10.000Z",
           "heartbeat_at": None, "log_state": None}
    out = slurmside.merge(dict(rec), d, {"slurm_state": "COMPLETING"}, now=1_800_000_000)
    assert out["state"] == "running"
    out = slurmside.merge(dict(rec), d, {"slurm_state": "TIMEOUT"}, now=1_800_000_000)
    assert (out["state"], out["log_state"]["failure"]["reason"]) == ("failed", "timeout")


def test_pending_carries_its_queue_time_as_its_own_segment(tmp_path):
    d = _run_dir(tmp_path)
    rec = {"id": d.name, "stage": "t", "host": "hpc", "state": "running", "started_at": None, "heartbeat_at": None}
    now = parse_iso("2026-12-02T00:01:30.000Z")  # submitted 90 s ago
    out = slurmside.merge(rec, d, {"slurm_state": "PENDING", "reason": "Resources", "queue_position": 2}, now=now)
    assert out["state"] == "pending" and out["slurm"]["reason"] == "Resources"
    assert out["slurm"]["queued_s"] == 90.0 and out["slurm"]["queue_position"] == 2
