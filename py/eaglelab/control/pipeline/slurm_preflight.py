"""Preflight checks of a Slurm host (pure: sinfo's facts in, verdicts out), in place of the GPU
check of a workstation: the GPUs are Slurm's to hand out, so the question is whether the request
can *ever* be satisfied (a job that cannot, pends forever with no error), not whether GPUs are free now.

  partition  the partition exists (sinfo lists it) and is up
  gres       some node of the partition has the GPUs per node asked for, on enough nodes
  workdir    the shared work dir exists and is writable from the login node
"""

from __future__ import annotations

from .checks import Check


def check_partition(facts: dict, opts: dict, host: str) -> Check:
    if facts.get("error"):
        return Check("slurm", False, f"{host}: Slurm does not answer: {facts['error']}",
                     "check the login node and the controller (`sinfo` there)")
    parts = facts.get("partitions") or {}
    want = opts.get("partition")
    if want is None:
        return Check("slurm", True, f"no partition asked: Slurm's default ({', '.join(parts) or 'none listed'})")
    # sinfo marks the default partition with `*`
    known = {p.rstrip("*"): v for p, v in parts.items()}
    if want not in known:
        return Check("slurm", False, f"partition {want!r} does not exist on {host}; "
                     f"partitions: {', '.join(sorted(known)) or '(none)'}",
                     f"set hosts.{host}.slurm.partition (or the stage's slurm.partition) to one of them")
    avail = known[want].get("avail", "up")
    if avail not in ("up", ""):
        return Check("slurm", None, f"partition {want!r} is {avail}: jobs will pend until it is up")
    return Check("slurm", True, f"partition {want!r} exists ({known[want]['nodes']} node(s), up)")


def check_gres(facts: dict, opts: dict, host: str) -> Check:
    need, nodes = int(opts.get("gpus") or 0), int(opts.get("nodes") or 1)
    parts = {p.rstrip("*"): v for p, v in (facts.get("partitions") or {}).items()}
    want = opts.get("partition") or next((p.rstrip("*") for p in facts.get("partitions") or {} if p.endswith("*")),
                                         None)
    part = parts.get(want or "")
    if part is None:
        return Check("gres", None, "partition unknown: cannot check GPUs")
    fitting = sum(g["nodes"] for g in part["gres"] if g["gpus"] >= need)
    have = ", ".join(sorted({g["gres"] for g in part["gres"]})) or "none"
    if need == 0:
        return Check("gres", True, "the stage asks no GPU")
    if fitting >= nodes:
        return Check("gres", True, f"{fitting} node(s) of {want!r} have >= {need} GPU(s) (gres: {have}); "
                                   f"{nodes} asked")
    return Check("gres", False, f"{nodes} node(s) with {need} GPU(s) each can never be allocated in {want!r}: "
                                f"{fitting} node(s) have that many (gres: {have}); the job would pend forever",
                 "ask fewer GPUs per node (stages.NAME.gpus / slurm.gpus) or more nodes, or another partition")


def check_workdir(facts: dict, host: str) -> Check:
    wd = facts.get("work_dir") or {}
    if wd.get("exists") and wd.get("writable"):
        return Check("workdir", True, f"work dir {wd['path']} is writable (it must be shared with the compute nodes)")
    return Check("workdir", False, f"work dir {wd.get('path')} on {host} "
                 f"{'is not writable' if wd.get('exists') else 'does not exist'}",
                 f"create it on the cluster's shared filesystem, or set hosts.{host}.work_dir there")


def checks(facts: dict, opts: dict, host: str) -> list[Check]:
    return [check_partition(facts, opts, host), check_gres(facts, opts, host), check_workdir(facts, host)]
