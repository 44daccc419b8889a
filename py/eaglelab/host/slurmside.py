"""What runs on a Slurm login node: sbatch a stage (jobwrap inside the allocation), report its runs
from the run directory *and* Slurm's queue, scancel one.

The run directory is the same as everywhere (docs/interfaces.md) on the cluster's shared work dir;
these files are added:
  slurm.json        at submit: job id, partition, submitted_at, the sbatch argv
  slurm_job.json    at submit: what to run in the allocation (command, cwd, env, python)
  job.sh            the batch script: `exec python -m eaglelab.host.slurmside inalloc RUN_DIR`, nothing else
  slurm.out         Slurm's own output for the job (slurmstepd's "exceeded memory limit", "DUE TO TIME LIMIT")
  slurm_alloc.json  inside the allocation, before jobwrap starts: node list, restart count, rendezvous
  slurm_end.json    the first time the job is seen ended in Slurm: its end state (so later reports
                    need no Slurm at all, and a job purged from Slurm keeps its end)
  attempt-N/        a requeued job's earlier attempt (its log, state, exit); the stage resumes from
                    its outputs, as every stage does when run again
Nothing from the config reaches a shell: sbatch gets an argv list, the batch script holds two
shlex-quoted paths, and the command travels as JSON.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from eaglelab.fsutil import UntrustedFolder, atomic_write_json, parse_iso, read_json, trusted_folder, utcnow_iso
from eaglelab.model import BadRecord, RunState

from . import hostside, machine, settle
from .settle import ACTIVE_STATES, END_STATES, OOM_TEXT, Liveness, SlurmWord

SLURM_TIMEOUT_S = 30
MASTER_PORT_BASE = 29500
HEARTBEAT_STALE_S = 30.0

# Slurm's states and what they mean for a run: eaglelab.host.settle (the one place a run's state is decided).
REFUSED_RC = 3  # the exit status of a start that `requeue: refuse` turned away
ATTEMPT_FILES = ("output.log", "state.json", "exit.json", "heartbeat", "jobwrap.log", "slurm_alloc.json")


class SlurmCommandError(RuntimeError):
    """A Slurm client command failed (the controller does not answer, a bad option ...)."""


def slurm(*argv: str, timeout: float = SLURM_TIMEOUT_S) -> str:
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmCommandError(f"{argv[0]} not found on this host: is it a Slurm login node?") from None
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    if cp.returncode != 0:
        raise SlurmCommandError(f"{shlex.join(argv[:2])} failed (rc {cp.returncode}): "
                                f"{(cp.stderr or cp.stdout).strip()[-400:]}")
    return cp.stdout


# -- submit -------------------------------------------------------------------------------------

def gpus_per_node(opts: dict) -> int:
    return int(opts.get("gpus") or 0)


def sbatch_argv(opts: dict, run_id: str, run_dir: Path, cwd: str) -> list[str]:
    """The sbatch command line for one run; opts are the host's slurm block merged with the stage's."""
    argv = ["sbatch", "--parsable", f"--job-name=eaglelab-{run_id}", f"--output={run_dir}/slurm.out",
            "--open-mode=append", f"--chdir={cwd}", "--export=ALL"]
    for key, flag in (("partition", "--partition"), ("account", "--account"), ("qos", "--qos"),
                      ("time", "--time"), ("mem", "--mem"), ("cpus", "--cpus-per-task")):
        if opts.get(key) not in (None, ""):
            argv.append(f"{flag}={opts[key]}")
    nodes = int(opts.get("nodes") or 1)
    if nodes > 1:
        argv += [f"--nodes={nodes}", "--ntasks-per-node=1"]
    g = gpus_per_node(opts)
    if g:
        # --gres counts per node on every Slurm; --gpus-per-node needs cons_tres (opt in with gpu_flag: gpus)
        argv.append(f"--gpus-per-node={g}" if opts.get("gpu_flag") == "gpus" else f"--gres=gpu:{g}")
    argv.append("--no-requeue" if requeue_policy(opts) == "refuse" else "--requeue")
    argv += [str(a) for a in opts.get("extra_args") or []]
    return argv


def requeue_policy(opts: dict) -> str:
    """allow | refuse (config's `requeue:`; a bool of an older config: yes is allow)."""
    v = opts.get("requeue", "allow")
    return "refuse" if v is False or v == "refuse" else "allow"


def submit(work_dir: str, spec: dict, opts: dict) -> dict:
    """Make the run directory, sbatch the job; the run's meta with its `slurm` block."""
    run_id = spec.get("run_id") or hostside.new_run_id(spec["stage"])
    run_dir = hostside._run_dir(work_dir, run_id)
    try:
        trusted_folder(run_dir.parent, "the run directories' folder")
    except UntrustedFolder as e:
        raise SlurmCommandError(f"{spec['stage']}: {e}; nothing was submitted") from None
    run_dir.mkdir(exist_ok=False, mode=0o700)  # private as hostside's: slurm.out, the log, the env
    cwd = spec.get("cwd") or os.getcwd()
    meta = {"schema": 1, "run_id": run_id, "stage": spec["stage"], "host": spec.get("host", "local"),
            "profile": spec.get("profile"), "fingerprint": spec.get("fingerprint"),
            "command": list(spec["command"]), "cwd": cwd, "kind": spec.get("kind", "job"),
            "launched_at": utcnow_iso(), "executor": "slurm"}
    atomic_write_json(run_dir / "meta.json", meta)
    python = spec.get("python") or sys.executable
    pkg_path = str(Path(__file__).resolve().parents[2])  # py/, above the eaglelab package
    # slurm_job.json holds the stage's env (secrets, maybe): this user's only
    os.close(os.open(run_dir / "slurm_job.json", os.O_WRONLY | os.O_CREAT, 0o600))
    atomic_write_json(run_dir / "slurm_job.json", {
        "schema": 1, "command": list(spec["command"]), "cwd": cwd, "env": spec.get("env") or {},
        "python": python, "nodes": int(opts.get("nodes") or 1), "gpus_per_node": gpus_per_node(opts),
        "requeue": requeue_policy(opts)})
    script = run_dir / "job.sh"
    script.write_text("#!/bin/sh\n# eaglelab: runs jobwrap inside the allocation (see eaglelab/host/slurmside.py)\n"
                      f"PYTHONPATH={shlex.quote(pkg_path)}${{PYTHONPATH:+:$PYTHONPATH}}; export PYTHONPATH\n"
                      f"exec {shlex.quote(python)} -m eaglelab.host.slurmside inalloc {shlex.quote(str(run_dir))}\n")
    script.chmod(0o755)
    argv = sbatch_argv(opts, run_id, run_dir, cwd) + [str(script)]
    try:
        out = slurm(*argv)
    except SlurmCommandError as e:
        atomic_write_json(run_dir / "exit.json", {"schema": 1, "exit_code": None, "signal": None, "signal_name": None,
                                                  "ended_at": utcnow_iso(), "state": RunState.FAILED, "error": str(e)})
        raise
    job_id = out.strip().split(";")[0]
    info = {"schema": 1, "job_id": job_id, "partition": opts.get("partition"), "submitted_at": utcnow_iso(),
            "sbatch": argv}
    atomic_write_json(run_dir / "slurm.json", info)
    return {**meta, "slurm": {"job_id": job_id, "partition": opts.get("partition"),
                              "submitted_at": info["submitted_at"]}}


# -- inside the allocation ---------------------------------------------------------------------

def hostnames(nodelist: str) -> list[str]:
    """Slurm's compressed node list (`gpu[01-03]`) expanded by scontrol; itself when that fails."""
    try:
        return slurm("scontrol", "show", "hostnames", nodelist).split() or [nodelist]
    except SlurmCommandError:
        return [nodelist]


def distributed_command(command: list[str], nnodes: int, gpus: int, master: str, port: int,
                        job_id: str) -> list[str]:
    """A stage command spread over nnodes nodes: one `srun` task per node, each a torchrun with
    gpus processes, meeting at a c10d rendezvous on the allocation's first node.
    `python -m mod args` / `python script args` keep their interpreter (torch.distributed.run)."""
    python, rest = command[0], command[1:]
    return ["srun", "--ntasks-per-node=1", f"--nodes={nnodes}", "--kill-on-bad-exit=1",
            python, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={max(gpus, 1)}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={master}:{port}", f"--rdzv-id=eaglelab-{job_id}", *rest]


def rotate_attempt(run_dir: Path, earlier: int) -> None:
    """A requeued job starts again in the same run directory: keep the files of the earlier attempt
    (its number: 1 for the first start) under attempt-<earlier - 1>/."""
    if earlier <= 0:
        return
    dest = run_dir / f"attempt-{earlier - 1}"
    dest.mkdir(exist_ok=True)
    for name in ATTEMPT_FILES:
        if (run_dir / name).exists():
            os.replace(run_dir / name, dest / name)


def _refuse_start(rd: Path, meta: dict, job_id: str, restarts: int, earlier: int) -> int:
    """`requeue: refuse`: a start of a run directory that was started before runs nothing. Said on
    stderr (Slurm's output file) and recorded in meta.json's `refused_starts` (`lab status` shows it)."""
    how = ("Slurm requeued it with a restart count of 0 (slurmctld restarted without its saved state?)"
           if restarts == 0 else f"Slurm requeued it (restart count {restarts})")
    message = (f"start {earlier + len(meta.get('refused_starts') or []) + 1} of run {rd.name} (Slurm job {job_id}) "
               f"refused: it already started at {meta.get('started_at')} and {how}, but its stage's slurm "
               f"setting is requeue: refuse; nothing was run. Look at the first attempt (`lab logs {rd.name}`), "
               f"then `lab run {meta.get('stage')} --force` for a new run, or set requeue: allow")
    print(f"eaglelab: {message}", file=sys.stderr, flush=True)
    entry = {"at": utcnow_iso(), "job_id": job_id, "restart_count": restarts, "message": message}
    atomic_write_json(rd / "meta.json", {**meta, "refused_starts": [*(meta.get("refused_starts") or []), entry]})
    return REFUSED_RC


def inalloc(run_dir: str) -> int:
    """The batch script's one command: note the allocation, then become jobwrap."""
    rd = Path(run_dir)
    job = read_json(rd / "slurm_job.json")
    if job is None:
        print(f"eaglelab: {rd}/slurm_job.json is missing or unreadable", file=sys.stderr)
        return 2
    env = os.environ
    job_id = env.get("SLURM_JOB_ID", "")
    restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
    meta = read_json(rd / "meta.json") or {}
    if meta.get("started_at"):  # started before: Slurm requeued it (a restart count of 0 too: a slurmctld
        earlier = meta.get("attempt") if isinstance(meta.get("attempt"), int) else 1  # that lost its state)
        if job.get("requeue") == "refuse":
            return _refuse_start(rd, meta, job_id, restarts, earlier)
        rotate_attempt(rd, earlier)  # jobwrap records the attempt (eaglelab.host.jobwrap.begin_attempt)
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    nodes = hostnames(nodelist) if nodelist else []
    nnodes = int(env.get("SLURM_JOB_NUM_NODES") or len(nodes) or 1)
    port = MASTER_PORT_BASE + (int(job_id) % 1000 if job_id.isdigit() else 0)
    master = nodes[0] if nodes else "127.0.0.1"
    alloc = {"schema": 1, "job_id": job_id, "nodelist": nodelist, "nodes": nodes, "nnodes": nnodes,
             "batch_host": os.uname().nodename, "restart_count": restarts, "started_at": utcnow_iso(),
             "gpus_on_node": env.get("SLURM_GPUS_ON_NODE"), "job_gpus": env.get("SLURM_JOB_GPUS"),
             "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"), "master_addr": master, "master_port": port}
    atomic_write_json(rd / "slurm_alloc.json", alloc)
    command = list(job["command"])
    if nnodes > 1:
        command = distributed_command(command, nnodes, int(job.get("gpus_per_node") or 1), master, port, job_id)
    stage_env = {**(job.get("env") or {}), "EAGLELAB_SLURM_JOB_ID": job_id, "MASTER_ADDR": master,
                 "MASTER_PORT": str(port), "EAGLELAB_NNODES": str(nnodes)}
    argv = [job["python"], "-m", "eaglelab.host.jobwrap", "--run-dir", str(rd), "--cwd", job["cwd"]]
    hostside.write_env_file(rd / "env.json", stage_env)
    argv += ["--env-file", str(rd / "env.json")]
    argv += ["--", *command]
    sys.stdout.flush()
    os.execv(job["python"], argv)
    return 0  # pragma: no cover - execv does not return


# -- what Slurm says ---------------------------------------------------------------------------

SQUEUE_FORMAT = "%i|%T|%r|%S|%V|%P|%N|%Q|%M"
FAR_FUTURE_S = 300 * 86400  # Slurm answers "a year from now" when it has no estimate


def slurm_time(s: str | None) -> str | None:
    """Slurm's local `2026-12-01T11:35:01` (or N/A, Unknown, None) -> our ISO UTC, or None."""
    if not s or s in ("N/A", "Unknown", "None", "(null)"):
        return None
    try:
        t = datetime.strptime(s, "%Y-%m-%dT%H:%M:%S").astimezone(UTC).timestamp()
    except ValueError:
        return None
    return utcnow_iso(t)


def queue(job_ids: list[str]) -> dict[str, dict]:
    """squeue for our jobs (active ones only), with each pending job's place in its partition."""
    out = slurm("squeue", "-h", "--me", "-o", SQUEUE_FORMAT)
    jobs = {}
    for line in out.splitlines():
        f = line.split("|")
        if len(f) < 9:
            continue
        jid, state, reason, start, submit_t, part, nodes, prio = f[:8]
        jobs[jid.split("_")[0]] = {"job_id": jid, "slurm_state": state.split()[0], "reason": reason,
                                   "start_estimate": slurm_time(start) if state == "PENDING" else None,
                                   "submitted_at": slurm_time(submit_t), "partition": part,
                                   "nodelist": nodes or None, "priority": _int(prio)}
    pending = [j for j in jobs.values() if j["slurm_state"] == "PENDING"]
    if any(jobs.get(j, {}).get("slurm_state") == "PENDING" for j in job_ids):
        # our job's place among every pending job of its partition (all users), by priority
        try:
            allpd = slurm("squeue", "-h", "-t", "PENDING", "-o", "%i|%P|%Q", "--sort=-p,i")
        except SlurmCommandError:
            allpd = ""
        order: dict[str, list[str]] = {}
        for line in allpd.splitlines():
            f = line.split("|")
            if len(f) >= 2:
                order.setdefault(f[1], []).append(f[0])
        for j in pending:
            ids = order.get(j["partition"], [])
            j["queue_position"] = ids.index(j["job_id"]) + 1 if j["job_id"] in ids else None
    for j in jobs.values():
        est = parse_iso(j.get("start_estimate"))
        if est is not None and est - time.time() > FAR_FUTURE_S:
            j["start_estimate"] = None
    return {k: v for k, v in jobs.items() if k in job_ids}


def _int(s: str) -> int | None:
    try:
        return int(s)
    except (TypeError, ValueError):
        return None


def ended_job(job_id: str) -> dict | None:
    """An ended job's state from scontrol (kept MinJobAge), else sacct; None when Slurm forgot it."""
    try:
        out = slurm("scontrol", "-o", "show", "job", job_id)
        kv = dict(p.split("=", 1) for p in out.split() if "=" in p)
        if kv.get("JobState"):
            return {"slurm_state": kv["JobState"], "reason": kv.get("Reason"), "exit_code": kv.get("ExitCode"),
                    "nodelist": kv.get("NodeList") if kv.get("NodeList") not in (None, "(null)") else None,
                    "partition": kv.get("Partition"), "ended_at": slurm_time(kv.get("EndTime")),
                    "started_at": slurm_time(kv.get("StartTime")), "restarts": _int(kv.get("Restarts", ""))}
    except SlurmCommandError as e:
        if "Invalid job id" not in str(e):
            raise
    try:
        out = slurm("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList,Partition,Start,End")
    except SlurmCommandError:
        return None  # no accounting here (sacct needs slurmdbd)
    for line in out.splitlines():
        f = line.split("|")
        if len(f) >= 7 and f[0] == job_id:
            return {"slurm_state": f[1].split()[0], "reason": None, "exit_code": f[2], "nodelist": f[3] or None,
                    "partition": f[4], "started_at": slurm_time(f[5]), "ended_at": slurm_time(f[6])}
    return None


# -- one run: the run directory and Slurm together ---------------------------------------------

def map_end(slurm_state: str, exit_info: dict | None, stop_requested: bool, slurm_out: bytes) -> tuple[str, str | None]:
    """(our state, failure reason) for a job Slurm says has ended: settle.map_end, slurm.out read for
    slurmstepd's out-of-memory line."""
    return settle.map_end(slurm_state, exit_info, stop_requested, bool(OOM_TEXT.search(slurm_out or b"")))


def slurm_word(run_dir: Path, sl: dict | None, slurm_error: str | None = None, now: float | None = None) -> SlurmWord:
    """What Slurm said of the run's job (sl: squeue's or scontrol's answer, or slurm_end.json), with
    the two facts of the shared work dir that settle weighs beside it: the heartbeat, slurm.out."""
    now = now or time.time()
    sl = sl or {}
    state = sl.get("slurm_state")
    try:
        fresh = now - (run_dir / "heartbeat").stat().st_mtime < HEARTBEAT_STALE_S
    except OSError:
        fresh = False
    return SlurmWord(state=state, reason=sl.get("reason"), job_id=(read_json(run_dir / "slurm.json") or {}).get("job_id"),
                     ended_at=sl.get("ended_at"), error=slurm_error, heartbeat_fresh=fresh,
                     oom_in_output=state == "FAILED" and bool(OOM_TEXT.search(_read(run_dir / "slurm.out"))))


def merge(rec: dict, run_dir: Path, sl: dict | None, slurm_error: str | None = None,
          now: float | None = None) -> dict:
    """rec (a run record as hostside.read_run made it, without Slurm) settled again with Slurm's
    word (eaglelab.host.settle), and its `slurm` block added."""
    now = now or time.time()
    exit_info = read_json(run_dir / "exit.json")
    live = Liveness(wrapper_alive=rec.get("state") == RunState.RUNNING and not rec.get("orphaned"),
                    spawning=rec.get("state") == RunState.PENDING, stage_alive=bool(rec.get("orphaned")),
                    end_unknown=rec.get("end_unknown"), stop_requested=bool(rec.get("stop_requested")),
                    last_sign_of_life=rec.get("ended_at"))
    settled = settle.settle({"started_at": rec.get("started_at")}, exit_info if isinstance(exit_info, dict) else None,
                            rec.get("log_state"), live, slurm_word(run_dir, sl, slurm_error, now))
    rec.update(settled.fields())
    return add_slurm_block(rec, run_dir, sl, slurm_error, now)


def add_slurm_block(rec: dict, run_dir: Path, sl: dict | None, slurm_error: str | None = None,
                    now: float | None = None) -> dict:
    """rec["slurm"]: job id, queue, nodes, restarts; the queue time as its own segment, the duration
    from the start in the allocation. No state is decided here (settle did)."""
    now = now or time.time()
    info = read_json(run_dir / "slurm.json") or {}
    alloc = read_json(run_dir / "slurm_alloc.json") or {}
    sl = dict(sl or {})
    block = {"job_id": info.get("job_id"), "partition": sl.get("partition") or info.get("partition"),
             "nodelist": sl.get("nodelist") or alloc.get("nodelist"), "nodes": alloc.get("nodes"),
             "submitted_at": info.get("submitted_at"), "state": sl.get("slurm_state"), "reason": sl.get("reason"),
             "queue_position": sl.get("queue_position"), "start_estimate": sl.get("start_estimate"),
             "restart_count": alloc.get("restart_count", 0), "exit_code": sl.get("exit_code"),
             "error": slurm_error}
    rec["slurm"] = block
    rec["submitted_at"] = info.get("submitted_at")
    # queue time is its own segment: submitted -> started (still growing while pending)
    started = parse_iso(rec.get("started_at"))
    submitted = parse_iso(info.get("submitted_at")) or parse_iso(rec.get("launched_at"))
    block["queued_s"] = None
    if submitted and started:
        block["queued_s"] = round(max(0.0, started - submitted), 3)
    elif submitted and rec["state"] == RunState.PENDING:
        block["queued_s"] = round(now - submitted, 3)
    if rec["state"] == RunState.PENDING:
        rec["duration_s"] = None
    end = parse_iso(rec.get("ended_at"))
    if started:
        rec["duration_s"] = round((end or now) - started, 3)
    return rec


def _read(p: Path, limit: int = 1 << 16) -> bytes:
    try:
        with open(p, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def read_run(run_dir: Path, sl: dict | None, slurm_error: str | None = None) -> dict:
    now = time.time()
    rec = hostside.read_run(run_dir, now=now, slurm=slurm_word(run_dir, sl, slurm_error, now))
    meta = read_json(run_dir / "meta.json") or {}
    rec["launched_at"] = meta.get("launched_at")
    return add_slurm_block(rec, run_dir, sl, slurm_error, now)


def report(work_dir: str, stage: str | None = None) -> dict:
    """Every run under work_dir with Slurm's word on each: one squeue for all, scontrol/sacct only
    for jobs that left the queue and whose end is not recorded yet."""
    seq = hostside.host_seq()  # before Slurm is asked: every run below is as of no earlier than this
    root = hostside.runs_dir(work_dir)
    dirs = []
    if root.is_dir():
        dirs = [d for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith(".")
                and (stage is None or d.name.startswith(stage + "-"))]
    jobs = {d: (read_json(d / "slurm.json") or {}).get("job_id") for d in dirs}
    open_jobs = {d: j for d, j in jobs.items() if j and not (d / "slurm_end.json").exists()}
    error = None
    try:
        active = queue(list(open_jobs.values())) if open_jobs else {}
    except SlurmCommandError as e:
        active, error = {}, str(e)
    runs, bad = [], []
    for d in dirs:
        jid = jobs[d]
        sl = read_json(d / "slurm_end.json")
        if sl is None and jid and error is None:
            sl = active.get(jid)
            if sl is None:
                try:
                    sl = ended_job(jid)
                except SlurmCommandError as e:
                    error = str(e)
                if sl is not None and sl.get("slurm_state") in END_STATES:
                    atomic_write_json(d / "slurm_end.json", {**sl, "schema": 1, "recorded_at": utcnow_iso()})
        try:
            runs.append({**read_run(d, sl, error), "host_seq": seq})
        except BadRecord as e:
            bad.append({"run_dir": str(d), "error": str(e)})
    return {"schema": 1, "runs": runs, "bad_runs": bad, "gpus": None, "checked_at": utcnow_iso(),
            "free_disk_bytes": machine.free_disk(work_dir), "slurm_error": error, "runs_dir": str(root),
            "host_seq": seq}


# -- stop ---------------------------------------------------------------------------------------

def _job_state(job_id: str) -> str | None:
    try:
        q = queue([job_id])
        if job_id in q:
            return q[job_id]["slurm_state"]
        e = ended_job(job_id)
        return e["slurm_state"] if e else None
    except SlurmCommandError:
        return None


def stop(work_dir: str, run_id: str, grace_s: float = 30.0) -> dict:
    """scancel: TERM to the batch step (jobwrap passes it to the stage's group), KILL after grace_s,
    like `lab stop` on an ssh host; the run as it ended."""
    run_dir = hostside._run_dir(work_dir, run_id)
    job_id = (read_json(run_dir / "slurm.json") or {}).get("job_id")
    if not job_id:
        return hostside.stop(work_dir, run_id, grace_s)
    state = _job_state(job_id)
    if state not in ACTIVE_STATES:
        return report_one(work_dir, run_id)
    (run_dir / "stop_requested").write_text(utcnow_iso() + "\n")
    if ACTIVE_STATES[state] is RunState.PENDING:
        slurm("scancel", job_id)
    else:
        slurm("scancel", "--full", "--signal=TERM", job_id)
        deadline = time.time() + grace_s
        while time.time() < deadline and not (run_dir / "exit.json").exists():
            time.sleep(0.2)
        if not (run_dir / "exit.json").exists():
            slurm("scancel", "--full", "--signal=KILL", job_id)
        slurm("scancel", job_id)  # end the allocation itself (no-op once the batch step exited)
    deadline = time.time() + 30
    while time.time() < deadline and _job_state(job_id) in ACTIVE_STATES:
        time.sleep(0.3)
    return report_one(work_dir, run_id)


def report_one(work_dir: str, run_id: str) -> dict:
    run_dir = hostside._run_dir(work_dir, run_id)
    for r in report(work_dir, run_id.rsplit("-", 2)[0])["runs"]:
        if r["id"] == run_id:
            return r
    return read_run(run_dir, None)


# -- preflight facts ---------------------------------------------------------------------------

def slurm_facts(opts: dict, work_dir: str) -> dict:
    """What preflight checks on a Slurm host: partitions and their nodes' GRES, the work dir."""
    out: dict = {"schema": 1, "partitions": {}, "error": None}
    try:
        text = slurm("sinfo", "-h", "-o", "%R|%G|%D|%c|%m|%l|%a")
    except SlurmCommandError as e:
        out["error"] = str(e)
        text = ""
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 7:
            continue
        part = out["partitions"].setdefault(f[0], {"gres": [], "nodes": 0, "max_cpus": 0, "max_mem_mb": 0,
                                                   "time_limit": f[5], "avail": f[6]})
        part["nodes"] += _int(f[2]) or 0
        part["max_cpus"] = max(part["max_cpus"], _int(f[3].rstrip("+")) or 0)
        part["max_mem_mb"] = max(part["max_mem_mb"], _int(f[4].rstrip("+")) or 0)
        part["gres"].append({"gres": f[1], "nodes": _int(f[2]) or 0, "gpus": gres_gpus(f[1])})
    wd = Path(work_dir).expanduser()
    try:
        (wd / "runs").mkdir(parents=True, exist_ok=True)  # as launch would
    except OSError as e:
        out["work_dir_error"] = str(e)
    out["work_dir"] = {"path": str(wd.resolve()), "exists": wd.is_dir(),
                       "writable": wd.is_dir() and os.access(wd, os.W_OK)}
    return out


def gres_gpus(gres: str) -> int:
    """`gpu:8`, `gpu:a100:4(S:0-1)`, `gpu:2,shard:4` -> GPUs per node."""
    n = 0
    for part in gres.split(","):
        bits = part.split("(")[0].split(":")
        if bits[0] == "gpu" and len(bits) >= 2:
            n += _int(bits[-1]) or 0
    return n


VERBS = {
    "slurm_submit": lambda a: submit(a["work_dir"], a["spec"], a.get("slurm") or {}),
    "slurm_report": lambda a: report(a["work_dir"], a.get("stage")),
    "slurm_stop": lambda a: stop(a["work_dir"], a["run_id"], a.get("grace_s", 30.0)),
    "slurm_facts": lambda a: slurm_facts(a.get("slurm") or {}, a["work_dir"]),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "inalloc":
        return inalloc(argv[1])
    print(json.dumps({"error": "usage: python -m eaglelab.host.slurmside inalloc RUN_DIR"}))
    return 2


if __name__ == "__main__":
    sys.exit(main())
