"""The tailer on files that real processes write while it watches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import wait_for as _wait_for
from eaglelab.control.commands.parse import tail_cmd
from eaglelab.fsutil import read_json
from eaglelab.host.tail import follow_run, run_state
from eaglelab.host.tail.run import RunFollower

ROOT = Path(__file__).resolve().parents[1]
TQDM_CHILD = r"""
import sys, time
from tqdm import tqdm
print("eaglelab: phase work started", flush=True)
for i in tqdm(range(int(sys.argv[1])), desc="Working", mininterval=0, file=sys.stderr):
    time.sleep(float(sys.argv[2]))
print("eaglelab: done", flush=True)
"""


def wait_for(cond, timeout=30.0, every=0.02):
    return _wait_for(cond, timeout, every)


class Following:
    """follow_run in a thread, as jobwrap runs it."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.stop = threading.Event()
        self.thread = threading.Thread(target=follow_run, args=(run_dir, self.stop), daemon=True)
        self.thread.start()

    def state(self) -> dict | None:
        return read_json(self.run_dir / "state.json")

    def finish(self) -> dict:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()
        return self.state()


def test_a_child_writing_tqdm_frames_is_followed_live(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    f = Following(run)
    with open(run / "output.log", "wb") as log:
        child = subprocess.Popen([sys.executable, "-c", TQDM_CHILD, "30", "0.05"], stdout=log, stderr=log)
        mid = wait_for(lambda: (s := f.state()) and s["progress"] and 0 < s["progress"]["n"] < 30 and s)
        assert mid["state"] == "running" and mid["phase"] == "work" and mid["progress"]["label"] == "Working"
        assert child.wait(30) == 0
    final = f.finish()
    assert final["state"] == "completed" and final["final"] is True
    assert final["progress"]["n"] == 30 and final["progress"]["total"] == 30
    assert final["frames"] >= 10                     # it saw the \r-frames, not just the end
    assert final["lines"] == (run / "output.log").read_bytes().count(b"\n")
    assert final["log_bytes"] == (run / "output.log").stat().st_size


def test_a_log_that_appears_after_the_watcher_started(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    f = Following(run)
    time.sleep(0.2)
    (run / "output.log").write_bytes(b"INFO:     Application startup complete.\n")
    s = wait_for(lambda: (s := f.state()) and s["ready"] and s)
    assert s["phase"] == "serving"
    f.finish()


def test_truncation_and_rotation_restart_from_the_top(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    log = run / "output.log"
    log.write_bytes(b"one\ntwo\nthree\n")
    fol = RunFollower(run)
    fol.read()
    assert fol.state.lines == 3
    log.write_bytes(b"x\n")                                   # truncated (reopened with 'w')
    fol.read()
    assert fol.reader.resets == 1 and fol.state.lines == 4
    with open(log, "ab") as f:                                # renamed away while more was written ...
        f.write(b"tail of the old file\n")
    log.rename(run / "output.log.1")
    log.write_bytes(b"Training epoch 1/1 completed\n")       # ... and a new file took its place
    fol.read()
    assert fol.reader.resets == 2 and fol.state.lines == 6   # the old file's tail was read first
    assert fol.write(final=True)["state"] == "completed"


def test_a_partial_last_line_counts_at_the_final_pass(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "output.log").write_bytes(b"ok\nModuleNotFoundError: No module named 'x'")
    f = Following(run)
    s = wait_for(lambda: f.state())
    assert s["lines"] == 1 and s["failure"] is None
    final = f.finish()
    assert final["lines"] == 2 and final["failure"]["reason"] == "import_error"


def jobwrap(run_dir: Path, code: str) -> dict:
    subprocess.run([str(ROOT / "bin" / "jobwrap"), "--run-dir", str(run_dir), "--", sys.executable, "-c", code],
                   check=False, timeout=120)
    return run_state(run_dir)


@pytest.mark.parametrize("code,state,reason", [
    ("import os, signal; print('loading', flush=True); os.kill(os.getpid(), signal.SIGKILL)", "failed", "host_oom_killed"),
    ("open('/dev/full', 'w').write('x' * 10**6)", "failed", "disk_full"),
    ("import eaglelab_no_such_module", "failed", "import_error"),
    ("raise SystemExit('bad config: key train.lr must be a number')", "failed", "other"),
    ("print('all good, no end marker')", "completed", None),
])
def test_under_jobwrap_the_final_state_combines_log_and_exit(tmp_path, code, state, reason):
    s = jobwrap(tmp_path / "run", code)
    assert s["state"] == state, s
    assert (s["failure"] or {}).get("reason") == reason
    assert s["final"] is True and s["exit"] is not None
    if reason == "other":
        assert s["failure"]["message"] == "ended by exit code 1; last line: bad config: key train.lr must be a number"


def test_lab_tail_once_writes_every_run_of_a_runs_directory(tmp_path):
    runs = tmp_path / "runs"
    for name, text in (("a", b"Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.00s/it]\n"),
                       ("b", b"Data generation complete!\n")):
        (runs / name).mkdir(parents=True)
        (runs / name / "output.log").write_bytes(text)
    (runs / "b" / "exit.json").write_text(json.dumps({"schema": 1, "exit_code": 0, "signal": None}))
    result = CliRunner().invoke(tail_cmd, [str(runs), "--once"])
    assert result.exit_code == 0, result.output
    a, b = read_json(runs / "a" / "state.json"), read_json(runs / "b" / "state.json")
    assert a["state"] == "running" and a["progress"]["n"] == 1
    assert b["state"] == "completed" and b["exit"]["exit_code"] == 0


def test_lab_tail_names_a_missing_directory(tmp_path):
    result = CliRunner().invoke(tail_cmd, [str(tmp_path / "nope"), "--once"])
    assert result.exit_code == 2 and "is not a directory" in result.output


def test_a_phase_far_longer_than_in_earlier_runs_is_a_stall(tmp_path):
    runs = tmp_path / "runs"
    for i, took in enumerate((100.0, 120.0, 110.0)):
        old = runs / f"extract-20261129T10000{i}-abcd"
        old.mkdir(parents=True)
        (old / "state.json").write_text(json.dumps({"schema": 1, "phases": [
            {"name": "extracting", "started_line": 1, "ended_line": 9, "duration_s": took}]}))
    run = runs / "extract-20261129T120000-beef"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"schema": 1, "stage": "extract", "pid": os.getpid()}))
    (run / "output.log").write_bytes(b"eaglelab: phase extracting started\n")
    now = [1000.0]
    fol = RunFollower(run, clock=lambda: now[0])
    assert fol.state.expected_phase_s == {"extracting": 110.0}
    fol.read()
    now[0] += 200                   # within 3x the earlier runs' median (330 s)
    assert fol.snapshot()["state"] == "running"
    now[0] += 200                   # past it, and nothing moved for more than 300 s
    s = fol.snapshot()
    assert s["state"] == "stalled" and s["stall"]["reason"] == "phase_overdue"


def test_lab_tail_does_not_reread_a_finished_run_it_only_adds_the_exit(tmp_path):
    run = tmp_path / "runs" / "tick-20261129T000000-aaaa"
    s = jobwrap(run, "print('hello')")            # jobwrap's tailer wrote the final log state
    raw = read_json(run / "state.json")
    assert raw["final"] is True and "exit" not in raw and s["state"] == "completed"
    (run / "output.log").write_bytes(b"")          # were it read again, its lines would drop to 0
    os.utime(run / "state.json")
    result = CliRunner().invoke(tail_cmd, [str(tmp_path / "runs"), "--once"])
    assert result.exit_code == 0, result.output
    after = read_json(run / "state.json")
    assert after["lines"] == 1 and after["exit"]["exit_code"] == 0 and after["state"] == "completed"


def test_a_wall_clock_step_back_does_not_freeze_the_state(tmp_path):
    """The tailer throttles by the monotonic clock: after the wall clock jumps an hour back (NTP, a
    VM restored), state.json is still written on time; its timestamps stay wall-clock."""
    from eaglelab.host.tail.run import IDLE_WRITE_S, RunFollower
    (tmp_path / "output.log").write_bytes(b"hello\n")
    wall, mono = [1_800_000_000.0], [100.0]
    f = RunFollower(tmp_path, clock=lambda: wall[0], tick=lambda: mono[0])
    f.read()
    f.write()
    wall[0] -= 3600  # the step back
    mono[0] += IDLE_WRITE_S + 0.1
    assert f.due()[0]  # by wall-clock arithmetic it would wait an hour
    with open(tmp_path / "output.log", "ab") as log:
        log.write(b"more\n")
    f.read()
    mono[0] += 1.0
    assert f.due()[0]
    assert f.write()["updated_at"].startswith("2027-01-15T07:")  # wall time, stepped back as it is


def test_copytruncate_while_the_tailer_lags_loses_nothing(tmp_path):
    """logrotate's copytruncate empties the log; the stage writes on, past our old offset, before
    the tailer looks again. The size alone says nothing then; the content does: read from 0."""
    from eaglelab.host.tail.follower import FileFollower
    log = tmp_path / "output.log"
    log.write_bytes(b"".join(b"old line %04d\n" % i for i in range(100)))
    f = FileFollower(log)
    got = b"".join(d for kind, d in f.read_new() if kind == "data")
    assert got.endswith(b"old line 0099\n")
    with open(log, "r+b") as fh:  # copytruncate: same inode, emptied in place
        fh.truncate(0)
    new = b"".join(b"NEW line %04d, longer than before\n" % i for i in range(100))
    with open(log, "ab") as fh:
        fh.write(new)
    assert len(new) > f.offset  # grown past where we were: a size check cannot see it
    events = list(f.read_new())
    assert events[0] == ("reset", b"") and b"".join(d for k, d in events if k == "data") == new
    with open(log, "ab") as fh:  # and plain appends afterwards are read once, no false resets
        fh.write(b"tail\n")
    assert list(f.read_new()) == [("data", b"tail\n")]


def test_copytruncate_of_a_log_of_identical_lines_loses_nothing(tmp_path):
    """Identical fixed-length lines (a `.` per step, a heartbeat line): after copytruncate the bytes
    before our offset read the same, so the content cannot tell; rewritten to the very size we had
    seen, the size said "no change" and those lines were lost; grown again past our offset while we
    lagged, the lines before our offset were. The size and mtime of the last look tell both."""
    from eaglelab.host.tail.follower import FileFollower
    log, line = tmp_path / "output.log", b"step ok\n"
    writer = "import sys; f = open(sys.argv[1], 'ab', buffering=0); [f.write(b'step ok\\n') for _ in range(int(sys.argv[2]))]"

    def write(n: int) -> None:  # the stage, appending (O_APPEND) as jobwrap's log is opened
        subprocess.run([sys.executable, "-c", writer, str(log), str(n)], check=True)

    def copytruncate() -> None:  # logrotate's: copy, then empty the file in place (same inode)
        time.sleep(0.05)  # the rewrite lands on a later mtime tick than the writes we read
        subprocess.run(["cp", str(log), str(log) + ".1"], check=True)
        subprocess.run(["truncate", "-s", "0", str(log)], check=True)

    write(100)
    f = FileFollower(log)
    assert b"".join(d for k, d in f.read_new() if k == "data") == line * 100
    copytruncate()
    write(100)  # exactly the size read before
    events = list(f.read_new())
    assert events[:1] == [("reset", b"")] and b"".join(d for k, d in events if k == "data") == line * 100, events[:2]
    assert list(f.read_new()) == []  # and nothing twice
    write(100)
    assert b"".join(d for k, d in f.read_new(max_bytes=len(line) * 50) if k == "data") == line * 50  # lagging
    copytruncate()
    write(160)  # past our offset (150 lines), short of the size seen (200)
    events = list(f.read_new())
    assert events[:1] == [("reset", b"")] and b"".join(d for k, d in events if k == "data") == line * 160
    write(1)  # plain appends afterwards: read once, no false reset
    assert list(f.read_new()) == [("data", line)]


def test_a_stage_that_prints_nothing_is_stalled_after_a_while(tmp_path):
    """No byte in the log since the start, the process alive: after SILENT_MAX_S it is `stalled`
    (`silent`), with its ETA unknown rather than "finishing now"."""
    import os as _os

    from eaglelab.fsutil import utcnow_iso
    from eaglelab.host.tail.run import SILENT_MAX_S, RunFollower
    (tmp_path / "output.log").write_bytes(b"")
    (tmp_path / "meta.json").write_text(json.dumps({"run_id": "s-1", "stage": "s", "pid": _os.getpid(),
                                                    "started_at": utcnow_iso(1_800_000_000.0)}))
    now = [1_800_000_000.0 + 60]
    f = RunFollower(tmp_path, clock=lambda: now[0])
    f.read()
    assert f.snapshot()["state"] == "running"  # a minute of silence is nothing
    now[0] += SILENT_MAX_S
    snap = f.snapshot()
    assert snap["state"] == "stalled" and snap["stall"]["reason"] == "silent"


CHATTY_STAGE = r"""
import sys
line = b"INFO 12-04 17:53:22 [loop.py:88] step %08d loss 0.123456 lr 0.000100 tokens 4096 grad_norm 1.2345\n"
sys.stdout.buffer.write(b"".join(line % i for i in range(int(sys.argv[1]))))  # ~40 MB at once
sys.stdout.buffer.write(b"RuntimeError: the last line says why\n")
sys.exit(3)
"""


def test_a_chatty_stage_s_end_is_recorded_before_its_backlog_is_parsed_and_the_log_parsed_once(tmp_path):
    """Issue 32 item 5: a stage wrote its log far faster than the tailer parses it (a GiB in
    seconds), then exited. The tailer writes state.json while it catches up (never "no state file
    yet"), jobwrap records the end without waiting for the backlog (exit.json is there while the
    state still covers part of the log), and the log is parsed once, by the tailer, to its last
    line. jobwrap waits 0 s for the tailer here (3 s in production): what is proven is the order."""
    run, lines = tmp_path / "run", 400_000
    run.mkdir()
    wrap = ("import sys, eaglelab.host.jobwrap as j; j.TAILER_WAIT_S = 0.0; sys.exit(j.main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", wrap, "--run-dir", str(run), "--", sys.executable, "-c",
                             CHATTY_STAGE, str(lines)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "py")})
    partial, at_exit = set(), None
    while proc.poll() is None:
        s, ended = read_json(run / "state.json"), (run / "exit.json").exists()
        size = (run / "output.log").stat().st_size if (run / "output.log").exists() else 0
        if s and 0 < s["log_bytes"] < size:
            partial.add(s["log_bytes"])
        if ended and at_exit is None:
            at_exit = s
        time.sleep(0.005)
    out = proc.stdout.read().decode()
    size = (run / "output.log").stat().st_size
    assert partial, "no state.json while the tailer caught up"
    assert at_exit is not None and not at_exit["final"] and at_exit["log_bytes"] < size, at_exit
    assert "final pass" not in out, out  # the tailer did not die; nobody parsed the log a second time
    raw = read_json(run / "state.json")  # the tailer's own last write, after exit.json: one parse, to the end
    assert raw["final"] and raw["log_bytes"] == size and raw["lines"] == lines + 1 and "exit" in raw
    assert raw["state"] == "failed" and raw["failure"]["line"] == lines + 1, raw["failure"]
    assert read_json(run / "exit.json")["exit_code"] == 3


def test_a_rotation_read_in_slices_finishes_the_old_file_first(tmp_path):
    """The tailer reads a backlog in slices (read_new's budget): a file rotated while its old one
    is not read to the end yet is finished first, over as many slices as it takes."""
    from eaglelab.host.tail.follower import FileFollower
    log = tmp_path / "output.log"
    old = b"".join(b"old %05d\n" % i for i in range(1000))
    log.write_bytes(old[:100])
    f = FileFollower(log)
    got = [d for _, d in f.read_new(64)]
    with open(log, "ab") as fh:
        fh.write(old[100:])
    log.rename(tmp_path / "output.log.1")
    log.write_bytes(b"new\n")
    for _ in range(1000):
        events = list(f.read_new(4096))
        got += [d for k, d in events if k == "data"]
        if ("reset", b"") in events:
            break
    assert b"".join(got) == old + b"new\n"
