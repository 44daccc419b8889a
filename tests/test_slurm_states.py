"""Slurm's end states mapped to ours (eaglelab.host.slurmside.END_STATES), row by row, and merged
with the run directory. Pure: the live cluster tests (tests/test_slurm_lab.py) cover the states a
single-node test cluster can produce; this covers every row, including those it cannot
(PREEMPTED, BOOT_FAIL, DEADLINE, REVOKED)."""

from __future__ import annotations

import json
import os

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
    ("TIMEOUT", "killed", False, "failed", "time_limit"),
    ("DEADLINE", None, False, "failed", "time_limit"),
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
    assert (out["state"], out["log_state"]["failure"]["reason"]) == ("failed", "time_limit")


def test_pending_carries_its_queue_time_as_its_own_segment(tmp_path):
    d = _run_dir(tmp_path)
    rec = {"id": d.name, "stage": "t", "host": "hpc", "state": "running", "started_at": None, "heartbeat_at": None}
    now = parse_iso("2026-12-02T00:01:30.000Z")  # submitted 90 s ago
    out = slurmside.merge(rec, d, {"slurm_state": "PENDING", "reason": "Resources", "queue_position": 2}, now=now)
    assert out["state"] == "pending" and out["slurm"]["reason"] == "Resources"
    assert out["slurm"]["queued_s"] == 90.0 and out["slurm"]["queue_position"] == 2


DIST_SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
with open(os.path.join(os.environ["OUT_DIR"], f"rank{dist.get_rank()}"), "w") as f:  # one file each: no interleaving
    f.write(f"rank {dist.get_rank()}/{dist.get_world_size()} sum {t.item():.0f}")
dist.destroy_process_group()
"""


def test_the_multi_node_command_is_a_working_torchrun_rendezvous(tmp_path):
    """nodes > 1: one srun task per node, each a torchrun meeting at a c10d rendezvous on the first
    node. One machine is one node, so the srun part is checked as argv and the torchrun part is run
    for real: one node of two CPU ranks (gloo) rendezvous at the address the allocation gives."""
    import socket
    import subprocess
    import sys
    script = tmp_path / "allreduce.py"
    script.write_text(DIST_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = slurmside.distributed_command([sys.executable, str(script)], nnodes=2, gpus=2, master="127.0.0.1",
                                         port=port, job_id="77")
    assert argv[:4] == ["srun", "--ntasks-per-node=1", "--nodes=2", "--kill-on-bad-exit=1"]
    torchrun = argv[4:]
    assert torchrun[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nnodes=2" in torchrun and "--nproc-per-node=2" in torchrun
    assert f"--rdzv-endpoint=127.0.0.1:{port}" in torchrun and "--rdzv-id=eaglelab-77" in torchrun
    one_node = [a if a != "--nnodes=2" else "--nnodes=1" for a in torchrun]
    p = subprocess.run(one_node, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "OUT_DIR": str(tmp_path)})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["rank 0/2 sum 3", "rank 1/2 sum 3"]
