"""A service nobody needs any more is stopped: by `lab pipeline` as soon as no stage left needs it,
and after its keep-alive when `lab run` started it (a detached reaper, so nobody has to watch);
`lab services` and `lab status` show it idle, with what it holds and when it stops. Real processes."""

from __future__ import annotations

import json
import socket
import sys

from conftest import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pipeline(port: int, keep_alive_s: float) -> str:
    return f"""\
        stages:
          svc:
            kind: service
            host: local
            command: ["{sys.executable}", "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
            ready: {{url: "http://127.0.0.1:{port}/", timeout_s: 30}}
            keep_alive_s: {keep_alive_s}
            stop_grace_s: 2
          client:
            host: local
            needs: [svc]
            command: ["{sys.executable}", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/')"]
          after:
            host: local
            depends_on: [client]
            command: ["{sys.executable}", "-c", "import time; time.sleep(3)"]
        """


def _read(path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def svc_state(tmplab) -> str:
    return tmplab.runs("svc")[-1]["state"]


def test_lab_run_leaves_a_reaper_that_stops_the_idle_service_after_its_keep_alive(tmplab):
    # 20 s: the three `lab` calls below must see it still up; on a loaded machine each takes seconds
    tmplab.write_pipeline(pipeline(free_port(), keep_alive_s=20))
    tmplab.lab("run", "client")
    rows = json.loads(tmplab.lab("services", "--json").stdout)["services"]
    assert len(rows) == 1 and rows[0]["in_use_by"] == [] and 0 < rows[0]["stops_in_s"] <= 20, rows
    text = tmplab.lab("status").stdout
    assert "service svc is IDLE" in text, text
    assert "IDLE for" in tmplab.lab("services").stdout
    assert svc_state(tmplab) == "running"  # kept alive: the next client would find it up
    wait_for(lambda: svc_state(tmplab) != "running", timeout=60, interval=1)
    assert svc_state(tmplab) == "killed", tmplab.runs("svc")  # stopped on request (TERM)
    log = (tmplab.logs / "services-reap.log").read_text()
    assert "stopping service svc" in log and "keep_alive_s 20" in log, log


def test_services_reap_stops_a_service_idle_past_its_keep_alive(tmplab):
    tmplab.write_pipeline(pipeline(free_port(), keep_alive_s=0))
    tmplab.lab("run", "svc")  # started by hand: idle from its start, and zero keep-alive
    assert "stopping service svc" in tmplab.lab("services", "--reap").stdout
    assert svc_state(tmplab) != "running"


def test_pipeline_stops_a_service_once_no_stage_left_needs_it(tmplab):
    tmplab.write_pipeline(pipeline(free_port(), keep_alive_s=3600))
    p = tmplab.lab("pipeline", "--no-notify")
    out = p.stdout
    stop_at = out.index("stopping service svc")
    assert "no stage left needs it" in out[stop_at:stop_at + 200]
    assert stop_at < out.index("starting after"), out  # before the next stage, not at the very end


def test_a_pipeline_never_stops_a_service_another_controllers_job_needs(tmplab):
    """The end of a pipeline (or a stage it no longer needs) stops services only when no live run
    needs them: here another controller (a cron firing, a second terminal) runs a job on it."""
    import io

    from eaglelab.control.lab import Lab
    port = free_port()
    tmplab.write_pipeline(pipeline(port, keep_alive_s=3600).replace(
        f"\"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/')\"",
        json.dumps("import time; time.sleep(60)")))
    tmplab.lab("run", "client", "--detach")  # the other controller: svc started, client running on it
    lab = Lab.load(str(tmplab.conf))
    out = io.StringIO()
    lab.stop_services(out=out)  # what `lab pipeline` does at its end
    assert "keeping service svc" in out.getvalue() and "in use by client" in out.getvalue(), out.getvalue()
    assert lab.latest("svc")["state"] == "running"


def test_ctrl_c_of_a_pipeline_never_stops_a_service_a_live_job_needs(tmplab):
    """Ctrl-C of `lab pipeline` leaves its job running (detached, on its host): the service that job
    needs is kept, so the job completes instead of failing midway; once the job is done the service
    is stopped after its keep-alive by the reaper the pipeline left behind."""
    import os
    import signal
    import subprocess

    from conftest import LAB
    port = free_port()
    # the client asks the service for 3 s and fails the moment it is gone
    client = (f"import time, urllib.request\nend = time.time() + 3\nwhile time.time() < end:\n"
              f"    urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=2); time.sleep(0.1)\n")
    tmplab.write_pipeline(pipeline(port, keep_alive_s=1).replace(
        f"\"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/')\"", json.dumps(client)))
    p = subprocess.Popen([str(LAB), "pipeline", "--no-notify"], env=tmplab.env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: [d for d in tmplab.run_dirs() if d.name.startswith("client-")
                          and b"started_at" in _read(d / "meta.json")], timeout=30, interval=0.05)
        os.kill(p.pid, signal.SIGINT)  # Ctrl-C: the pipeline only
        out = p.communicate(timeout=30)[0]
    finally:
        if p.poll() is None:
            p.kill()
    assert "keeping service svc" in out and "in use by client" in out, out
    def ended(stage: str) -> dict | None:  # the run's exit.json, as its host recorded it
        (d,) = [d for d in tmplab.run_dirs() if d.name.startswith(stage + "-")]
        return json.loads(_read(d / "exit.json") or b"null")

    assert wait_for(lambda: ended("client"), timeout=30)["state"] == "completed", out
    assert wait_for(lambda: ended("svc"), timeout=30)["state"] == "killed"  # idle: reaped
