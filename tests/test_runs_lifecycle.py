"""Detached stages through jobwrap: they outlive the shell, end recorded (exit code, signal), stop
by process group, and `lab run` is idempotent. Real processes throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import LAB, fill_disk, remove_dead_faketime_files
from eaglelab.fsutil import parse_iso

PIPELINE = """\
vars:
  steps: "10"
stages:
  tick:
    host: local
    command: ["${python}", "-m", "eaglelab.stages.tick", "--steps", "${steps}", "--delay", "0.3",
              "--output", "${work_dir}/out/tick.json"]
    outputs: ["${work_dir}/out/tick.json"]
  fail3:
    host: local
    command: ["${python}", "-m", "eaglelab.stages.tick", "--steps", "5", "--delay", "0.05", "--fail-at", "2"]
  sleeper:
    host: local
    command: ["${python}", "-c", "import time; print('sleeping', flush=True); time.sleep(600)"]
    stop_grace_s: 2
  stubborn:
    host: local
    command: ["${python}", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"]
    stop_grace_s: 1
  saver:
    host: local
    command: ["${python}", "-c", "import os, signal, time; signal.signal(signal.SIGTERM, lambda *a: (print('saved on TERM', flush=True), os._exit(3))); print('up', flush=True); time.sleep(600)"]
    stop_grace_s: 20
  envdump:
    host: local
    command: ["${python}", "-c", "import os, json; print(json.dumps({k: os.environ.get(k) for k in ('PYTHONUNBUFFERED', 'COLUMNS', 'EAGLELAB_RUN_ID')}))"]
  after:
    host: local
    command: ["true"]
    depends_on: [fail3]
"""


def _state(tmplab, run_id):
    return next(r for r in tmplab.runs() if r["id"] == run_id)


def _meta(tmplab, run_id):
    return json.loads((tmplab.work / "runs" / run_id / "meta.json").read_text())


def test_detached_stage_survives_lab_and_its_shell(tmplab):
    tmplab.write_pipeline(PIPELINE.replace('steps: "10"', 'steps: "20"'))  # long enough to kill mid-run
    # `lab run` attached (following the log) inside a shell; kill the shell's whole group mid-run.
    shell = subprocess.Popen(["sh", "-c", '"$0" run tick; echo after', str(LAB)], env=tmplab.env(),
                             start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = tmplab.wait_for(lambda: next((r for r in tmplab.runs("tick") if r["state"] == "running"), None))
    os.killpg(shell.pid, signal.SIGKILL)
    shell.wait()
    killed_at = time.time()
    # A new process sees it carry on and end completed, after the shell and its `lab` were gone.
    done = tmplab.wait_for(lambda: (r := _state(tmplab, run["id"]))["state"] not in ("running", "pending") and r)
    assert (done["state"], done["exit_code"], done["signal"]) == ("completed", 0, None)
    assert parse_iso(done["ended_at"]) > killed_at and done["started_at"] < done["ended_at"]
    assert json.loads((tmplab.work / "out" / "tick.json").read_text()) == {"steps": 20}
    log = (tmplab.work / "runs" / run["id"] / "output.log").read_bytes()
    assert b"tick: done" in log and b"\r" in log  # tqdm frames reach the log raw


def test_sigkill_from_outside_ends_failed_host_oom_killed_with_signal_9(tmplab):
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "sleeper", "--detach")
    run = tmplab.runs("sleeper")[0]
    os.kill(_meta(tmplab, run["id"])["pid"], signal.SIGKILL)
    done = tmplab.wait_for(lambda: (r := _state(tmplab, run["id"]))["state"] != "running" and r)
    # nobody asked for it: a failure, the same at run level and in the log state (one rule)
    assert (done["state"], done["signal"], done["exit_code"]) == ("failed", 9, None)
    exit_json = json.loads((tmplab.work / "runs" / run["id"] / "exit.json").read_text())
    assert exit_json["state"] == "failed" and exit_json["signal_name"] == "SIGKILL"
    log_state = tmplab.wait_for(lambda: (r := _state(tmplab, run["id"])).get("log_state") and r["log_state"])
    assert (log_state["state"], log_state["failure"]["reason"]) == ("failed", "host_oom_killed")


def test_exit_3_ends_failed_with_exit_code_3_and_is_rerun(tmplab):
    tmplab.write_pipeline(PIPELINE)
    p = tmplab.lab("run", "fail3", check=False)
    assert p.returncode == 3, p.stdout + p.stderr
    runs = tmplab.runs("fail3")
    assert [(r["state"], r["exit_code"]) for r in runs] == [("failed", 3)]
    # A stage that depends on it refuses to start, naming it.
    p = tmplab.lab("run", "after", check=False)
    assert p.returncode != 0 and "depends on 'fail3'" in p.stderr and "failed" in p.stderr
    # Typed again: a failed stage starts again.
    tmplab.lab("run", "fail3", check=False)
    assert len(tmplab.runs("fail3")) == 2


def test_completed_unchanged_stage_is_skipped_and_changed_one_reruns(tmplab):
    tmplab.write_pipeline(PIPELINE.replace('steps: "10"', 'steps: "2"'))
    tmplab.lab("run", "tick")
    p = tmplab.lab("run", "tick")
    assert "up to date" in p.stdout
    assert len(tmplab.runs("tick")) == 1
    tmplab.write_pipeline(PIPELINE.replace('steps: "10"', 'steps: "3"'))  # config changed
    p = tmplab.lab("run", "tick")
    assert "changed" in p.stdout and len(tmplab.runs("tick")) == 2


def test_two_lab_runs_at_once_make_one_job(tmplab):
    tmplab.write_pipeline(PIPELINE)
    procs = [subprocess.Popen([str(LAB), "run", "tick", "--detach"], env=tmplab.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert len(tmplab.run_dirs()) == 1, outs
    assert sum("starting tick" in o for o in outs) == 1
    assert sum("attaching" in o for o in outs) == 2


def test_attach_follows_a_running_stage_to_its_end(tmplab):
    tmplab.write_pipeline(PIPELINE.replace('steps: "10"', 'steps: "6"'))
    tmplab.lab("run", "tick", "--detach")
    p = tmplab.lab("run", "tick")  # attaches, streams the log, returns when it ends
    assert "attaching" in p.stdout and "tick: done" in p.stdout and "completed" in p.stdout
    assert len(tmplab.run_dirs()) == 1


def test_stop_terms_then_kills_the_process_group(tmplab):
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "stubborn", "--detach")
    run = tmplab.runs("stubborn")[0]
    tmplab.wait_for(lambda: b"up" in (tmplab.work / "runs" / run["id"] / "output.log").read_bytes())
    p = tmplab.lab("stop", "stubborn")
    assert "killed (signal 9)" in p.stdout
    pgid = _meta(tmplab, run["id"])["pgid"]
    tmplab.wait_for(lambda: _group_gone(pgid), timeout=10)
    done = _state(tmplab, run["id"])
    assert (done["state"], done["signal"]) == ("killed", 9)
    # A polite stage stops at TERM.
    tmplab.lab("run", "sleeper", "--detach")
    p = tmplab.lab("stop", "sleeper")
    assert "killed (signal 15)" in p.stdout


def test_stop_of_a_paused_stage_lets_it_save_on_term(tmplab):
    """A group someone paused (kill -STOP, Ctrl-Z on the host) is continued after the TERM, as a
    shell does: it saves and exits at once instead of sitting out the grace to a KILL."""
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "saver", "--detach")
    run = tmplab.runs("saver")[0]
    log = tmplab.work / "runs" / run["id"] / "output.log"
    tmplab.wait_for(lambda: b"up" in log.read_bytes())
    os.killpg(_meta(tmplab, run["id"])["pgid"], signal.SIGSTOP)
    tmplab.lab("stop", "saver")
    assert b"saved on TERM" in log.read_bytes()
    done = _state(tmplab, run["id"])
    assert done["signal"] != 9 and done["exit_code"] == 3, done


def _group_gone(pgid):
    try:
        os.killpg(pgid, 0)
        return False
    except ProcessLookupError:
        return True


def test_stage_environment_and_recorded_command(tmplab):
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "envdump")
    run = tmplab.runs("envdump")[0]
    rd = tmplab.work / "runs" / run["id"]
    env = json.loads((rd / "output.log").read_text().strip().splitlines()[-1])
    assert env == {"PYTHONUNBUFFERED": "1", "COLUMNS": "1000", "EAGLELAB_RUN_ID": run["id"]}
    meta = json.loads((rd / "meta.json").read_text())
    assert meta["command"][1] == "-c" and meta["cwd"] and meta["pid"] and meta["pgid"] == meta["pid"]
    assert (rd / "heartbeat").exists()
    exit_info = json.loads((rd / "exit.json").read_text())
    assert exit_info["exit_code"] == 0 and exit_info["state"] == "completed"


def test_registry_is_rebuilt_from_the_run_directories(tmplab):
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "fail3", check=False)
    tmplab.lab("run", "envdump")
    before = {(r["id"], r["state"], r["exit_code"]) for r in tmplab.runs()}
    for f in tmplab.logs.glob("registry.sqlite*"):
        f.unlink()
    after = {(r["id"], r["state"], r["exit_code"]) for r in tmplab.runs()}
    assert after == before and len(after) == 2


def test_logs_shows_the_last_frame_of_progress_lines(tmplab):
    tmplab.write_pipeline(PIPELINE.replace('steps: "10"', 'steps: "3"'))
    tmplab.lab("run", "tick")
    out = tmplab.lab("logs", "tick").stdout
    assert "3/3" in out and "0/3" not in out and "tick: done" in out
    p = tmplab.lab("logs", "tickk", check=False)
    assert p.returncode != 0 and "did you mean 'tick'" in p.stderr


def test_final_state_covers_the_log_even_when_the_live_tailer_fell_short(tmp_path):
    """jobwrap's safety net: a tailer that died early leaves a stale state; jobwrap parses the log
    then (the one case it is read twice), so the last state covers the whole log. (A tailer still
    busy is waited for instead: test_a_chatty_stage_s_end_is_recorded_before_its_backlog…)"""
    from eaglelab.fsutil import atomic_write_json
    from eaglelab.host import jobwrap

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    frames = "".join(f"\rEvaluating: {i * 100 // 3}%| | {i}/3 [00:0{i}<00:00, 1.00req/s]" for i in range(4))
    (run_dir / "output.log").write_text(frames + "\neval: done\n")
    atomic_write_json(run_dir / "state.json", {"schema": 1, "progress": {"n": 0, "total": 3}, "lines": 0,
                                               "log_bytes": 10, "final": False})
    jobwrap._ensure_final_state(run_dir)
    st = json.loads((run_dir / "state.json").read_text())
    assert st["progress"]["n"] == 3 and st["log_bytes"] == (run_dir / "output.log").stat().st_size
    assert st["final"] is True


def test_sigkilled_jobwrap_leaves_an_orphan_never_run_twice_and_stoppable(tmplab):
    """The wrapper dies (kill -9, the OOM killer) while its stage lives on: the run is `running`,
    `orphaned` — not lost — so `lab run` attaches instead of starting a second copy, and `lab stop`
    stops the stage and records the end in the wrapper's place."""
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "sleeper", "--detach")
    run = tmplab.runs("sleeper")[0]
    meta = tmplab.wait_for(lambda: (m := _meta(tmplab, run["id"])).get("pid") and m)
    os.kill(meta["jobwrap_pid"], signal.SIGKILL)
    orphan = tmplab.wait_for(lambda: (r := _state(tmplab, run["id"])).get("orphaned") and r)
    assert orphan["state"] == "running" and not orphan["lost"]
    assert _live_in_group(meta["pgid"])  # the stage itself goes on
    p = tmplab.lab("run", "sleeper", "--detach")
    assert "already running" in p.stdout + p.stderr and len(tmplab.run_dirs()) == 1
    p = tmplab.lab("stop", "sleeper")
    assert "killed" in p.stdout, p.stdout
    tmplab.wait_for(lambda: not _live_in_group(meta["pgid"]), timeout=10)
    done = _state(tmplab, run["id"])
    assert (done["state"], done["signal"], done["orphaned"]) == ("killed", signal.SIGTERM, False)
    exit_json = json.loads((tmplab.work / "runs" / run["id"] / "exit.json").read_text())
    assert exit_json["stop_requested"] and "wrapper was gone" in exit_json["recorded_by"]


def test_a_planted_pgid_is_never_signalled(tmplab):
    """meta.json is only a file: `lab stop` signals a group only when its processes carry this run's
    EAGLELAB_RUN_DIR (a run directory naming another process group, ours or not, harms nobody)."""
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        tmplab.write_pipeline(PIPELINE)
        tmplab.lab("run", "sleeper", "--detach")
        run = tmplab.runs("sleeper")[0]
        meta_path = tmplab.work / "runs" / run["id"] / "meta.json"
        meta = tmplab.wait_for(lambda: (m := _meta(tmplab, run["id"])).get("pid") and m)
        os.kill(meta["jobwrap_pid"], signal.SIGKILL)
        os.killpg(meta["pgid"], signal.SIGKILL)
        tmplab.wait_for(lambda: not _live_in_group(meta["pgid"]), timeout=10)
        meta_path.write_text(json.dumps({**meta, "pgid": bystander.pid, "pid": bystander.pid}))
        st = tmplab.wait_for(lambda: (r := _state(tmplab, run["id"]))["state"] != "running" and r)
        assert st["lost"] and not st["orphaned"]  # the bystander does not make the run alive
        tmplab.lab("stop", run["id"], check=False)
        assert bystander.poll() is None  # and is not signalled
    finally:
        bystander.kill()
        bystander.wait()


def _live_in_group(pgid: int) -> list[int]:
    """Processes of the group that are not zombies (an orphan's parent is gone; whoever adopts it
    may reap late, and a zombie still answers killpg)."""
    live = []
    for d in Path("/proc").iterdir():
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if d.name.isdigit() and int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(d.name))
    return live


def test_a_slow_jobwrap_start_is_pending_not_lost(tmp_path):
    """jobwrap can take longer than any grace to start on a loaded host or a cold venv: while the
    process hostside spawned lives, the run is pending, never lost (and launched a second time)."""
    import sys

    from eaglelab.host import hostside
    slow = tmp_path / "slowpy"
    slow.write_text(f"#!/bin/sh\nsleep 12\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    work = tmp_path / "work"
    hostside.launch(str(work), {"stage": "s", "command": [sys.executable, "-c", "print('hi')"],
                                "python": str(slow), "cwd": str(tmp_path)}, wait_s=0.2)
    (run_dir,) = list((work / "runs").iterdir())
    assert (run_dir / "spawned.json").exists()
    later = time.time() + 60  # as if a minute had gone by: the spawned process still lives
    assert hostside.read_run(run_dir, now=later)["state"] == "pending"
    deadline = time.time() + 60
    while hostside.read_run(run_dir)["state"] != "completed" and time.time() < deadline:
        time.sleep(0.3)
    assert hostside.read_run(run_dir)["state"] == "completed"


def test_a_lost_run_is_finalized(tmplab):
    """Wrapper and stage both gone with no exit recorded: the run ends at its last sign of life
    (its duration stops growing) and its log state no longer says running."""
    from eaglelab.host import hostside
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "sleeper", "--detach")
    run = tmplab.runs("sleeper")[0]
    meta = tmplab.wait_for(lambda: (m := _meta(tmplab, run["id"])).get("pid") and m)
    run_dir = tmplab.work / "runs" / run["id"]
    tmplab.wait_for(lambda: (run_dir / "state.json").exists())
    os.kill(meta["jobwrap_pid"], signal.SIGKILL)
    os.killpg(meta["pgid"], signal.SIGKILL)
    tmplab.wait_for(lambda: not _live_in_group(meta["pgid"]), timeout=10)
    first = tmplab.wait_for(lambda: (r := hostside.read_run(run_dir))["state"] != "running" and r)
    later = hostside.read_run(run_dir, now=time.time() + 3600)
    assert (first["state"], first["lost"]) == ("killed", True) and first["ended_at"]
    assert later["duration_s"] == first["duration_s"] < 60
    assert later["log_state"]["state"] == "killed" and later["log_state"]["stall"] is None
    fail = later["log_state"]["failure"]  # a silent death, said as one, with the last line it wrote
    assert fail["reason"] == "lost" and "no exit line" in fail["message"]


def test_a_launch_that_cannot_start_leaves_no_fake_run(tmp_path):
    import sys

    from eaglelab.host import hostside
    work = tmp_path / "work"
    with pytest.raises(hostside.LaunchError, match="cannot start jobwrap"):
        hostside.launch(str(work), {"stage": "s", "command": [sys.executable, "-c", "x" * 300_000]})
    assert list((work / "runs").iterdir()) == []  # no run directory to read as "killed, lost"


def test_a_stage_secret_is_on_no_command_line_and_in_no_world_readable_file(tmplab):
    """`env:` values (tokens, keys) reach the stage, but not `ps` (jobwrap's or hostside's command
    line) nor meta.json: they travel in a 0600 file, names only on record."""
    secret = "hf_sEcReT_0123456789"
    tmplab.write_pipeline(PIPELINE + f'''  secretive:
    host: local
    env: {{HF_TOKEN: "{secret}"}}
    command: ["${{python}}", "-c", "import os, time; print(os.environ['HF_TOKEN'][:3], flush=True); time.sleep(30)"]
    stop_grace_s: 1
''')
    tmplab.lab("run", "secretive", "--detach")
    run = tmplab.runs("secretive")[0]
    rd = tmplab.work / "runs" / run["id"]
    tmplab.wait_for(lambda: b"hf_" in (rd / "output.log").read_bytes())
    cmdlines = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmdlines.append(p.read_bytes())
        except OSError:
            pass  # that process just ended
    assert not [c for c in cmdlines if secret.encode() in c]
    meta = json.loads((rd / "meta.json").read_text())
    assert meta["env_keys"] == ["HF_TOKEN"] and secret not in (rd / "meta.json").read_text()
    assert (rd / "env.json").stat().st_mode & 0o077 == 0
    tmplab.lab("stop", "secretive")


FILL = ("import sys\nf = open(sys.argv[1], 'wb')\n"
        "try:\n    while True:\n        f.write(b'x' * 65536); f.flush()\n"
        "except OSError as e:\n    print('stage:', e, flush=True); sys.exit(1)\n")


def test_a_disk_that_fills_up_never_loses_the_end_of_a_run(tiny_disk, tmp_path):
    """The stage fills the disk its run directory is on: the tailer and the heartbeat meet ENOSPC and
    go on, and the end is still recorded (its space was reserved at start): failed, disk_full."""
    import sys

    from eaglelab.host import hostside
    script = tmp_path / "fill.py"
    script.write_text(FILL)
    hostside.launch(str(tiny_disk), {"stage": "fill", "cwd": str(tmp_path),
                                     "command": [sys.executable, str(script), str(tiny_disk / "big.bin")]})
    (run_dir,) = (tiny_disk / "runs").iterdir()
    deadline = time.time() + 60
    while not (run_dir / "exit.json").exists() and time.time() < deadline:
        time.sleep(0.2)
    rec = hostside.read_run(run_dir)
    assert (rec["state"], rec["exit_code"]) == ("failed", 1), rec
    assert rec["log_state"]["failure"]["reason"] == "disk_full", rec["log_state"]
    assert not rec["lost"]
    (tiny_disk / "big.bin").unlink()  # space again: the directory reads the same, nothing to repair
    assert hostside.read_run(run_dir)["state"] == "failed"


def test_a_disk_full_at_launch_starts_nothing_and_leaves_nothing(tiny_disk, tmp_path):
    import sys

    from eaglelab.host import hostside
    (tiny_disk / "runs").mkdir(mode=0o700)
    fill_disk(tiny_disk / "filler")
    with pytest.raises(hostside.LaunchError, match="nothing was started|free space"):
        hostside.launch(str(tiny_disk), {"stage": "s", "command": [sys.executable, "-c", "print(1)"],
                                         "cwd": str(tmp_path)})
    assert list((tiny_disk / "runs").iterdir()) == []
    assert hostside.report(str(tiny_disk))["bad_runs"] == []


def test_an_orphan_that_ends_on_its_own_is_adopted_from_its_log(tmplab):
    """jobwrap is killed, the stage goes on and finishes by itself: nobody recorded its exit, but
    its log says how it ended (eaglelab's end marker): completed, not lost, and not run again."""
    tmplab.write_pipeline(PIPELINE + """  marked:
    host: local
    command: ["${python}", "-c", "import os, sys, time\\nfrom eaglelab.host.parse.markers import done_line\\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.1)\\nprint(done_line(), flush=True)", "${work_dir}/go"]
""")
    tmplab.lab("run", "marked", "--detach")
    run = tmplab.runs("marked")[0]
    meta = tmplab.wait_for(lambda: (m := _meta(tmplab, run["id"])).get("pid") and m)
    os.kill(meta["jobwrap_pid"], signal.SIGKILL)
    tmplab.wait_for(lambda: _state(tmplab, run["id"]).get("orphaned"))
    (tmplab.work / "go").touch()  # it ends now, however long the machine took to see it orphaned
    done = tmplab.wait_for(lambda: (r := _state(tmplab, run["id"]))["state"] != "running" and r, timeout=60)
    assert (done["state"], done["lost"]) == ("completed", False), done
    p = tmplab.lab("run", "marked")
    assert "up to date" in p.stdout and len(tmplab.run_dirs()) == 1


MANIFESTED = """  manifested:
    host: local
    command: ["${python}", "-c", "import sys, time\\nfrom pathlib import Path\\nfrom eaglelab import manifest\\nout, go = Path(sys.argv[1]), Path(sys.argv[2])\\nfor i in range(1, 1001):\\n    if go.exists(): break\\n    time.sleep(0.2); print(f'\\\\rwork: {i // 10}%| | {i}/1000 [00:01<00:01, 5.00it/s]', end='', flush=True)\\nout.mkdir(parents=True, exist_ok=True); (out / 'data.bin').write_bytes(b'x' * 100)\\nmanifest.write(out, 'manifested', [out / 'data.bin'])\\n", "${work_dir}/out/m", "${work_dir}/go"]
    outputs: ["${work_dir}/out/m"]
"""


def test_an_orphan_that_finishes_is_completed_by_its_outputs_manifest_and_followed_meanwhile(tmplab):
    """jobwrap is SIGKILLed, the stage goes on and finishes by itself, printing no end marker (no
    shipped stage prints one): its progress is followed while it is orphaned, and the manifest it
    wrote for this run into its outputs makes it `completed` (not `killed, lost`), never run again.
    A manifest of another run, or one whose files do not match, proves nothing."""
    from eaglelab.host import hostside
    tmplab.write_pipeline(PIPELINE + MANIFESTED)
    tmplab.lab("run", "manifested", "--detach")
    run = tmplab.runs("manifested")[0]
    run_dir = tmplab.work / "runs" / run["id"]
    meta = tmplab.wait_for(lambda: (m := _meta(tmplab, run["id"])).get("pid") and m, interval=0.05)
    os.kill(meta["jobwrap_pid"], signal.SIGKILL)
    def orphaned_at() -> int | None:  # the progress its state shows while it is orphaned
        r = hostside.read_run(run_dir)
        return ((r["log_state"] or {}).get("progress") or {}).get("n", 0) if r.get("orphaned") else None

    first = tmplab.wait_for(lambda: (n := orphaned_at()) is not None and [n], interval=0.05)[0]
    followed = tmplab.wait_for(lambda: (n := orphaned_at() or -1) >= first + 3 and n, interval=0.1)  # live
    (tmplab.work / "go").touch()  # the stage writes its outputs and their manifest, and exits 0
    done = tmplab.wait_for(lambda: (r := _state(tmplab, run["id"]))["state"] != "running" and r, timeout=30)
    assert (done["state"], done["lost"]) == ("completed", False), done
    assert done["log_state"]["state"] == "completed" and done["log_state"]["progress"]["n"] >= followed
    exit_json = json.loads((run_dir / "exit.json").read_text())
    assert str(tmplab.work / "out" / "m" / "manifest.json") in exit_json["outputs_done"]
    p = tmplab.lab("run", "manifested")
    assert "up to date" in p.stdout and len(tmplab.run_dirs()) == 1


def test_only_a_sound_manifest_of_the_run_itself_proves_an_unrecorded_end(tmp_path):
    from eaglelab.host import hostside
    out = tmp_path / "out"
    out.mkdir()
    (out / "data.bin").write_bytes(b"x" * 100)
    meta = {"run_id": "s-20261204T000000-abcd", "cwd": str(tmp_path), "outputs": ["out"]}
    run_dir = tmp_path / "runs" / meta["run_id"]
    doc = {"schema": 1, "files": {"data.bin": {"size": 100}}, "run_id": meta["run_id"]}
    (out / "manifest.json").write_text(json.dumps(doc))
    assert hostside.outputs_done(run_dir, meta)
    assert hostside.outputs_done(run_dir, {**meta, "outputs": ["out/data.bin"]})  # a file: the manifest beside it
    assert not hostside.outputs_done(run_dir, {**meta, "outputs": ["out", "elsewhere"]})  # every output
    assert not hostside.outputs_done(run_dir, {**meta, "outputs": []})
    (out / "manifest.json").write_text(json.dumps({**doc, "run_id": "s-20261203T000000-0000"}))
    assert not hostside.outputs_done(run_dir, meta)  # an earlier run's
    (out / "manifest.json").write_text(json.dumps({**doc, "files": {"data.bin": {"size": 200}}}))
    assert not hostside.outputs_done(run_dir, meta)  # a truncated file


DEPENDENT = """\
stages:
  first:
    host: local
    command: ["${python}", "-m", "eaglelab.stages.tick", "--steps", "3", "--delay", "0.2"]
  second:
    host: local
    command: ["true"]
    depends_on: [first]
"""


def test_the_dependency_check_asks_the_host_before_it_refuses(tmplab):
    """The registry says `first` is running (nobody has asked since it ended): `lab run second`
    asks first's host, sees it completed, and runs."""
    from eaglelab.control.lab import Lab
    tmplab.write_pipeline(DEPENDENT)
    tmplab.lab("run", "first", "--detach")
    run_dir = tmplab.run_dirs()[0]
    tmplab.wait_for(lambda: (run_dir / "exit.json").exists(), timeout=30)
    lab = Lab.load(str(tmplab.conf))
    assert lab.registry.get(run_dir.name)["state"] == "running"  # what the registry last heard
    p = tmplab.lab("run", "second", check=False)
    assert p.returncode == 0 and "depends on" not in p.stderr, p.stdout + p.stderr
    assert [r["state"] for r in tmplab.runs("second")] == ["completed"]


def test_a_slow_poller_writing_last_never_sets_an_ended_run_back_to_running(tmplab):
    """A report asked for while the run ran, written after another process recorded its end (the
    page's refresher next to a `lab run` following the stage): the run stays completed and the
    stage that depends on it starts."""
    import time as _time

    from eaglelab.control.lab import Lab, checked_report
    tmplab.write_pipeline(DEPENDENT.replace('"3"', '"20"'))
    tmplab.lab("run", "first", "--detach")
    lab = Lab.load(str(tmplab.conf))
    asked_at = _time.time()
    stale = checked_report("local", lab.executor("local").report("first"))
    assert [r["state"] for r in stale["runs"]] == ["running"]
    tmplab.lab("run", "first")  # attaches, follows it to its end, records completed
    lab.registry.sync_host("local", stale, as_of=asked_at)  # the slow answer lands last
    assert [r["state"] for r in tmplab.runs("first")] == ["completed"]
    stale["runs"][0]["log_state"] = None
    lab.registry.sync_host("local", stale, as_of=_time.time() + 60)  # however late it claims to be
    assert lab.registry.latest("first")["state"] == "completed"
    tmplab.lab("run", "second")


def test_status_without_refresh_shows_a_never_contacted_host_as_not_contacted_yet(tmplab):
    tmplab.write_pipeline(DEPENDENT)
    before = tmplab.lab("status", "--no-refresh")
    (row,) = [ln for ln in before.stdout.splitlines() if "local" in ln and "reach" not in ln][:1]
    assert "not contacted yet" in row and " ok " not in row, before.stdout
    host = json.loads(tmplab.lab("status", "--no-refresh", "--json").stdout)["hosts"][0]
    assert (host["contacted"], host["reachable"]) == (False, None)
    tmplab.lab("status")  # asks the host
    after = json.loads(tmplab.lab("status", "--no-refresh", "--json").stdout)["hosts"][0]
    assert (after["contacted"], after["reachable"]) == (True, True)
    assert "not contacted yet" not in tmplab.lab("status", "--no-refresh").stdout


def test_a_local_launch_that_fails_is_an_error_not_a_traceback(tmplab):
    """O-13: a local launch that cannot start (here: jobwrap's interpreter exits at once) and a
    `lab stop` of a run whose meta.json was damaged printed raw LaunchError / BadRecord tracebacks."""
    tmplab.write_lab(f"  broken:\n    reach: local\n    work_dir: {tmplab.work}\n    python: /bin/false\n")
    tmplab.write_pipeline(PIPELINE + """\
  nostart:
    host: broken
    command: ["true"]
""")
    p = tmplab.lab("run", "nostart", check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "host 'broken': nostart: jobwrap exited 1 before starting the stage" in p.stderr, p.stderr[-500:]


def test_a_stop_of_a_damaged_run_is_an_error_not_a_traceback(tmplab):
    import shutil
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "sleeper", "--detach")
    (rd,) = tmplab.run_dirs()
    run = {"id": rd.name, **tmplab.wait_for(lambda: (m := json.loads((rd / "meta.json").read_text())).get("pgid") and m)}
    os.killpg(run["pgid"], signal.SIGKILL)
    (rd / "meta.json").write_text("{damaged")  # the registry still says running
    try:
        p = tmplab.lab("stop", run["id"], check=False)
    finally:  # jobwrap outlives its stage a moment to record the end: it may still be writing in there
        tmplab.wait_for(lambda: shutil.rmtree(rd, ignore_errors=True) or not rd.exists(), timeout=30)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert f"host 'local': cannot stop {run['id']}" in p.stderr and "meta.json" in p.stderr, p.stderr


@pytest.mark.parametrize("plant", ["runs_of_another_user", "runs_0777", "work_parent_0777", "logs_of_another_user"])
def test_a_folder_on_the_lab_path_that_others_could_write_is_refused(tmplab, plant):
    """O-3: a pre-made 0777 `runs/` of another user let them rename a live run's directory (then
    `lab stop` crashed, `lab run` attached to a phantom). Every folder the lab writes in, and each
    one above it, is checked for owner and mode before anything is written; refused, naming it."""
    nobody = 65534
    tmplab.write_pipeline(PIPELINE)
    if plant == "work_parent_0777":  # the work dir under a folder anyone may rename things in
        shared = tmplab.root / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        tmplab.work = shared / "work"
        tmplab.write_lab()
        bad, why = shared, "has mode 777: others may rename what is in it"
    elif plant == "logs_of_another_user":
        tmplab.logs.mkdir()
        os.chown(tmplab.logs, nobody, nobody)
        bad, why = tmplab.logs, f"belongs to uid {nobody}, not to you"
    else:
        bad = tmplab.work / "runs"
        bad.mkdir(parents=True)
        bad.chmod(0o777)
        if plant == "runs_of_another_user":
            os.chown(bad, nobody, nobody)
        why = f"belongs to uid {nobody}, not to you" if plant == "runs_of_another_user" else "has mode 777"
    p = tmplab.lab("run", "envdump", check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert str(bad) in p.stderr and why in p.stderr and "Move it aside" in p.stderr, p.stderr
    runs = tmplab.work / "runs"
    assert not runs.is_dir() or list(runs.iterdir()) == []  # nothing was started


@pytest.mark.parametrize("damage", ["meta_unreadable", "directory_gone"])
def test_a_run_whose_directory_is_gone_or_unreadable_is_ended_not_a_ghost(tmplab, damage):
    """A live run whose meta.json became unreadable, or whose directory vanished (a host wiped, a
    disk replaced), used to stay `running` in the registry forever: attached to, waited on by
    `lab run`, attached to even with --force. Confirmed missing, it is ended `lost` with the reason;
    `lab stop` says so (no traceback), `lab run` holds it for a person, `--force` starts a new run."""
    import shutil
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "sleeper", "--detach")
    (rd,) = tmplab.run_dirs()
    meta = tmplab.wait_for(lambda: (m := _meta(tmplab, rd.name)).get("pgid") and m)
    os.kill(meta["jobwrap_pid"], signal.SIGKILL)
    os.killpg(meta["pgid"], signal.SIGKILL)
    if damage == "meta_unreadable":
        (rd / "meta.json").write_text("{damaged")
    else:
        shutil.rmtree(rd)
    try:
        p = tmplab.lab("stop", rd.name, check=False)  # the registry still says running
    finally:
        shutil.rmtree(rd, ignore_errors=True)  # the fixture's cleanup reads every meta.json
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "recorded killed" in p.stderr and "no longer reports it" in p.stderr, p.stderr
    ghost = _state(tmplab, rd.name)
    assert (ghost["state"], ghost["lost"]) == ("killed", True), ghost
    assert ("meta.json" if damage == "meta_unreadable" else "is gone") in ghost["end_unknown"], ghost
    if damage == "meta_unreadable":
        return  # the same from here on
    p = tmplab.lab("run", "sleeper", "--detach", check=False)
    assert p.returncode != 0 and "--force" in p.stderr and "attaching" not in p.stdout, p.stdout + p.stderr
    p = tmplab.lab("run", "sleeper", "--detach", "--force")
    assert "starting sleeper" in p.stdout and "attaching" not in p.stdout, p.stdout
    assert len(tmplab.run_dirs()) == 1 and tmplab.run_dirs()[0].name != rd.name  # a new run


def test_an_interrupted_local_stop_still_kills_a_stage_that_ignores_term(tmplab):
    """Ctrl-C of `lab stop` during its grace period (the terminal signals its whole process group):
    the escalation runs on in a session of its own, as over ssh, so a stage that ignores TERM is
    KILLed after the grace and its end recorded (killed, on request), never left alive."""
    tmplab.write_pipeline(PIPELINE)
    tmplab.lab("run", "stubborn", "--detach")
    (rd,) = tmplab.run_dirs()
    meta = tmplab.wait_for(lambda: (m := _meta(tmplab, rd.name)).get("pgid") and b"up" in (rd / "output.log").read_bytes()
                           and m, interval=0.05)
    stop = subprocess.Popen([str(LAB), "stop", rd.name, "--grace", "2"], env=tmplab.env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmplab.wait_for(lambda: (rd / "stop_requested").exists(), timeout=30, interval=0.05)  # TERM sent (ignored)
    os.killpg(stop.pid, signal.SIGINT)  # Ctrl-C
    stop.wait(timeout=30)
    assert _live_in_group(meta["pgid"])  # the grace is not over: still alive
    tmplab.wait_for(lambda: not _live_in_group(meta["pgid"]), timeout=20, interval=0.1)
    end = tmplab.wait_for(lambda: json.loads((rd / "exit.json").read_text()) if (rd / "exit.json").exists() else None,
                          timeout=20)
    assert (end["state"], end["signal"], end["stop_requested"]) == ("killed", signal.SIGKILL, True), end


def test_one_status_from_a_controller_hours_ahead_never_freezes_a_live_run(tmplab):
    """Reports used to be ordered by the controller's wall clock: one `lab status` from a controller
    2 h ahead (faketime; a backward NTP step does the same to the others) stamped the rows 2 h in
    the future, and every later report was "older news" until the clock caught up: progress and
    duration frozen on the CLI and the page. Ordered by the host's own sequence, the next real report
    updates them. (FAKETIME_DONT_FAKE_MONOTONIC: a wall clock set wrong or stepped by NTP leaves the
    monotonic clock alone; libfaketime would otherwise move both.)"""
    tmplab.write_pipeline(PIPELINE.replace('steps: "10"', 'steps: "400"').replace('"0.3"', '"0.1"'))  # killed at the end
    tmplab.lab("run", "tick", "--detach")
    (rd,) = tmplab.run_dirs()

    def done_steps() -> int:
        st = json.loads((rd / "state.json").read_text()) if (rd / "state.json").exists() else {}
        return ((st.get("progress") or {}).get("n") or 0) if st.get("state") == "running" else 0

    tmplab.wait_for(lambda: done_steps() >= 2, timeout=30, interval=0.1)
    # libfaketime's thread-safe build (lab status asks hosts from a thread pool), preloaded directly, not
    # through the `faketime` wrapper (one process and its per-pid files in /dev/shm fewer; a later wrapper
    # given a stale file's pid failed with "sem_open: File exists"). The library leaves its own files too:
    # removed below.
    (lib,) = Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1")
    try:
        ahead = subprocess.run([str(LAB), "status", "--json"], capture_output=True, text=True, timeout=60,
                               env={**tmplab.env(), "LD_PRELOAD": str(lib), "FAKETIME": "+2h",
                                    "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    finally:
        remove_dead_faketime_files()  # the library's own per-pid files, left even by a normal exit
    assert ahead.returncode == 0, ahead.stdout + ahead.stderr
    (then,) = [r for r in json.loads(ahead.stdout)["runs"] if r["id"] == rd.name]
    assert then["state"] == "running" and then["duration_s"] > 7000, then  # it did see the clock 2 h ahead
    seen = then["log_state"]["progress"]["n"]
    tmplab.wait_for(lambda: done_steps() >= seen + 3, timeout=30, interval=0.1)
    now = _state(tmplab, rd.name)  # the next report, by a controller whose clock is right
    assert now["state"] == "running" and now["log_state"]["progress"]["n"] >= seen + 3, (seen, now["log_state"])
    assert now["duration_s"] < then["duration_s"] - 3600, now  # by this clock again, not frozen at +2 h


def test_a_paused_stage_s_frozen_time_is_not_learned_as_work(tmplab):
    """A stage someone SIGSTOPped (kill -STOP of its group, Ctrl-Z on the host) does no work until
    continued; its wall duration included that time, and the ETA history learned it as the stage's
    duration. jobwrap sees the stop and the continue (waitpid), exit.json says how long it was
    stopped, and the history learns the duration less that."""
    from eaglelab.control.lab import Lab
    tmplab.write_pipeline(PIPELINE.replace('steps: "10"', 'steps: "30"').replace('"0.3"', '"0.1"'))
    tmplab.lab("run", "tick", "--detach")
    (rd,) = tmplab.run_dirs()
    meta = tmplab.wait_for(lambda: (m := _meta(tmplab, rd.name)).get("pgid") and m, interval=0.05)
    os.killpg(meta["pgid"], signal.SIGSTOP)
    time.sleep(1.5)  # paused: no work
    os.killpg(meta["pgid"], signal.SIGCONT)
    end = tmplab.wait_for(lambda: json.loads((rd / "exit.json").read_text()) if (rd / "exit.json").exists() else None,
                          timeout=30)
    assert end["state"] == "completed" and end["stopped"]["total_s"] > 0 and len(end["stopped"]["intervals"]) == 1, end
    (run,) = tmplab.runs("tick")  # a report: the registry learns from the completed run
    assert run["stopped"] == end["stopped"]
    (learned,) = [p for p in Lab.load(str(tmplab.conf)).registry.phase_history("tick") if p["phase"] == "__run__"]
    assert learned["duration_s"] == round(run["duration_s"] - end["stopped"]["total_s"], 3), (learned, run)
    assert learned["duration_s"] < run["duration_s"]
