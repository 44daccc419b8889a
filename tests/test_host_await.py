"""A controller waits on the host, not on its own clock: `hostside await_change` and `ready` with
wait_s look again where the run is (a stat every AWAIT_STEP_S) and answer once something changed.
Over ssh each question starts a Python on the host, so `Lab.wait` asks once per AWAIT_S of a quiet
run, not twice a second. Real jobwrap runs throughout."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from eaglelab.control.lab import Lab
from eaglelab.host import hostside


def launch(work, code: str) -> str:
    meta = hostside.launch(str(work), {"stage": "s", "command": [sys.executable, "-c", code], "cwd": str(work),
                                       "env": {}})
    return meta["run_id"]


def run_dir(work, run_id):
    return work / "runs" / run_id


def test_await_change_answers_when_the_run_ends_and_not_before(tmp_path):
    rid = launch(tmp_path, "import time; time.sleep(2)")
    assert hostside.await_change(str(tmp_path), rid, timeout_s=0.3)["changed"] is None  # still running
    assert hostside.await_change(str(tmp_path), rid, timeout_s=25)["changed"] == "ended"
    assert (run_dir(tmp_path, rid) / "exit.json").exists()


def test_await_change_answers_when_the_log_grows_past_the_offset(tmp_path):
    rid = launch(tmp_path, "import time; time.sleep(1); print('line', flush=True); time.sleep(30)")
    try:
        assert hostside.await_change(str(tmp_path), rid, timeout_s=25, log_offset=0)["changed"] == "log"
        size = (run_dir(tmp_path, rid) / "output.log").stat().st_size
        assert size > 0
        assert hostside.await_change(str(tmp_path), rid, timeout_s=0.5, log_offset=size)["changed"] is None
    finally:
        hostside.stop(str(tmp_path), rid, grace_s=1)


def test_await_change_answers_when_the_wrapper_is_gone(tmp_path):
    rid = launch(tmp_path, "import time; time.sleep(60)")
    meta = json.loads((run_dir(tmp_path, rid) / "meta.json").read_text())
    try:
        os.kill(meta["jobwrap_pid"], signal.SIGKILL)  # the stage lives on, unwatched: the report decides
        assert hostside.await_change(str(tmp_path), rid, timeout_s=25)["changed"] == "wrapper_gone"
    finally:
        os.killpg(meta["pgid"], signal.SIGKILL)


def test_ready_waits_on_the_host_for_the_log_line(tmp_path):
    rid = launch(tmp_path, "import time; time.sleep(1); print('server up', flush=True); time.sleep(30)")
    try:
        assert hostside.ready(str(tmp_path), rid, None, "server up")["ready"] is False  # asked once, too early
        assert hostside.ready(str(tmp_path), rid, None, "server up", wait_s=25) == {"ready": True, "how": "log"}
    finally:
        hostside.stop(str(tmp_path), rid, grace_s=1)


def test_ready_stops_waiting_when_the_service_ends(tmp_path):
    rid = launch(tmp_path, "raise SystemExit(3)")
    assert hostside.ready(str(tmp_path), rid, None, "never printed", wait_s=25)["ready"] is False
    assert (run_dir(tmp_path, rid) / "exit.json").exists()


def test_lab_wait_asks_a_quiet_run_a_few_times_not_twice_a_second(tmplab):
    """A 6 s run followed by `Lab.wait`: the host is asked for a report about once per AWAIT_S (it
    was 12+ times at the old 0.5 s poll), and the end is still seen."""
    tmplab.write_pipeline('stages:\n  nap:\n    host: local\n    command: ["${python}", "-c", '
                          '"import time; time.sleep(6)"]\n')
    lab = Lab.load(str(tmplab.conf))
    ex = lab.executor("local")
    asked = []
    real_report = ex.report
    ex.report = lambda stage=None: asked.append(time.monotonic()) or real_report(stage)
    rec = lab.run("nap", wait=False)
    final = lab.wait(rec, out=None)
    assert final["state"] == "completed"
    assert 1 <= len(asked) <= 6, len(asked)
