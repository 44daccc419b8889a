"""Notifications and plans: exactly once with several processes polling, stalled, a stop on purpose
is no failure, the three body formats, the pure rules (events, propagation, schedules)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, TmpLab, wait_for
from eaglelab.control import notify
from eaglelab.control.pipeline import cron as cronlib
from eaglelab.control.pipeline.plan import propagate
from eaglelab.errors import EaglelabError
from test_cron import Receiver, _kill_drainer

POLLER = """
import sys, time
from eaglelab.control.lab import Lab
lab = Lab.load()
stage, until = sys.argv[1], sys.argv[2]
deadline = time.time() + 60
while time.time() < deadline:
    lab.refresh()
    r = lab.latest(stage) or {}
    if r.get("state") == until or (r.get("log_state") or {}).get("state") == until:
        break
    time.sleep(0.05)
"""


@pytest.fixture
def hooked(tmplab: TmpLab):
    r = Receiver()
    tmplab.write_lab(f"notify:\n  status_url: http://127.0.0.1:8765/\n  webhooks:\n"
                     f"    - {{url: '{r.url}/g', format: generic}}\n")
    tmplab.write_pipeline("""\
        stages:
          quick:
            host: local
            command: ["${python}", "-m", "eaglelab.stages.tick", "--steps", "15", "--delay", "0.1"]
          sleepy:
            host: local
            command: ["${python}", "-m", "eaglelab.stages.tick", "--steps", "1", "--delay", "120"]
          stuck:
            # a vLLM server with a request in flight and no tokens coming: the tailer calls it stalled
            host: local
            command: ["${python}", "-c", "import time; [print('INFO 11-29 03:00:0%d [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%%' % i, flush=True) for i in range(3)]; time.sleep(120)"]
        """)
    yield tmplab, r
    _kill_drainer(tmplab)
    r.close()


def pollers(lab: TmpLab, stage: str, until: str, n: int = 3) -> None:
    env = {**lab.env(), "PYTHONPATH": f"{REPO}/py"}
    procs = [subprocess.Popen([sys.executable, "-c", POLLER, stage, until], env=env) for _ in range(n)]
    for p in procs:
        assert p.wait(timeout=90) == 0


def notifications(lab: TmpLab) -> list[tuple[str, str]]:
    db = sqlite3.connect(lab.logs / "registry.sqlite")
    try:
        return db.execute("SELECT event, stage FROM notifications ORDER BY created_at").fetchall()
    finally:
        db.close()


def test_completed_once_with_three_processes_polling(hooked):
    lab, receiver = hooked
    lab.lab("run", "quick", "--detach")
    pollers(lab, "quick", "completed")  # three processes race to see the run end
    assert notifications(lab) == [("completed", "quick")]
    lab.wait_for(lambda: [d for d in json.loads(lab.lab("notify", "log", "--json").stdout)["deliveries"]
                          if d["state"] == "sent"])
    (got,) = receiver.json("/g")
    run = lab.runs("quick")[-1]
    assert got["event"] == "completed" and got["run_id"] == run["id"] and got["host"] == "local"
    assert got["duration_s"] > 0 and got["text"].startswith("quick completed on local in ")
    # Later polls of the same ended run are no news.
    lab.lab("status")
    assert notifications(lab) == [("completed", "quick")]
    # The webhook's URL (a secret for Slack) is on no screen and in no log; those files are private.
    secret = f"{receiver.url}/g"
    shown = lab.lab("notify", "log").stdout + lab.lab("notify", "log", "--json").stdout
    assert secret not in shown and "http://127.0.0.1:" in shown and "/…#" in shown
    log = lab.logs / "notify.log"
    lab.wait_for(lambda: log.exists() and "sent" in log.read_text())
    assert secret not in log.read_text()
    assert log.stat().st_mode & 0o077 == 0 and (lab.logs / "registry.sqlite").stat().st_mode & 0o077 == 0


def test_stalled_once_and_a_stop_on_purpose_is_no_failure(hooked):
    lab, receiver = hooked
    lab.lab("run", "stuck", "--detach")
    pollers(lab, "stuck", "stalled")  # the tailer (in jobwrap) reads the log and writes state.json
    assert notifications(lab) == [("stalled", "stuck")]
    lab.wait_for(lambda: receiver.json("/g"))
    (got,) = receiver.json("/g")
    assert got["event"] == "stalled" and got["text"].startswith("stuck stalled on local (running for ")
    assert "3 stats lines in a row with requests running and 0 tokens/s" in got["reason"]

    out = lab.lab("stop", "stuck", "--grace", "2").stdout
    assert "killed" in out
    assert notifications(lab) == [("stalled", "stuck")]  # stopped by a person: no "failed"


def test_a_killed_stage_is_a_failure_with_its_signal(hooked):
    lab, receiver = hooked
    lab.lab("run", "sleepy", "--detach")
    run = lab.wait_for(lambda: [r for r in lab.runs("sleepy") if r["state"] == "running" and r.get("pid")])[0]
    os.kill(run["pid"], signal.SIGKILL)  # the stage dies (OOM killer, a person with kill -9)
    pollers(lab, "sleepy", "failed", n=2)
    assert notifications(lab) == [("failed", "sleepy")]
    lab.wait_for(lambda: receiver.json("/g"))
    (got,) = receiver.json("/g")
    # the tailer's verdict, combined with the exit: SIGKILL with no reason in the log
    assert got["reason"].startswith("host_oom_killed: killed by SIGKILL") and got["signal"] == 9


# -- pure rules --------------------------------------------------------------------------------

def test_events_for_transitions():
    running = {"state": "running", "log_state": None}
    assert notify.events_for(None, {"state": "completed"}) == []  # first seen ended: history
    assert notify.events_for(running, {"state": "completed"}) == ["completed"]
    assert notify.events_for(running, {"state": "failed"}) == ["failed"]
    assert notify.events_for(running, {"state": "killed", "stop_requested": True}) == []
    assert notify.events_for(running, {"state": "killed", "lost": True}) == ["failed"]
    assert notify.events_for({"state": "completed"}, {"state": "completed"}) == []
    stalled = {"state": "running", "log_state": {"state": "stalled"}}
    assert notify.events_for(running, stalled) == ["stalled"]
    assert notify.events_for(stalled, stalled) == []


def test_failure_reason_prefers_the_parsers_diagnosis():
    run = {"stage": "train", "host": "gpu1", "id": "train-1", "state": "failed", "exit_code": 1, "duration_s": 3725,
           "log_state": {"failure": {"reason": "cuda_oom", "message": "torch.OutOfMemoryError: CUDA out of memory",
                                     "line": 812}}}
    p = notify.stage_payload("failed", run, "http://lab:8765/", 0)
    assert p["reason"] == "cuda_oom: torch.OutOfMemoryError: CUDA out of memory"
    assert p["text"] == "train failed on gpu1 after 1h 02m: cuda_oom: torch.OutOfMemoryError: CUDA out of memory"
    body, headers = notify.render("slack", p)
    slack = json.loads(body)
    assert slack["text"].startswith(":x: train failed on gpu1") and "<http://lab:8765/|status page>" in body.decode()
    body, headers = notify.render("ntfy", p)
    assert body.decode().startswith("train failed on gpu1") and headers["Priority"] == "4"
    assert headers["Click"] == "http://lab:8765/" and headers["Title"] == "eaglelab: failed"
    body, headers = notify.render("generic", p)
    assert json.loads(body)["failure"]["reason"] == "cuda_oom" and headers["Content-Type"] == "application/json"


def test_upstream_reruns_propagate_downstream_only():
    deps = {"a": [], "b": ["a"], "c": ["b"], "d": ["a"], "e": []}
    own = {n: ("skip", "up to date") for n in deps}
    assert propagate(list(deps), deps, own) == own
    out = propagate(list(deps), deps, {**own, "b": ("run", "failed")})
    assert [n for n in deps if out[n][0] == "run"] == ["b", "c"]
    assert out["c"][1] == "upstream b will rerun, so its outputs change"
    out = propagate(list(deps), deps, {**own, "a": ("attach", "running")})
    assert [n for n in deps if out[n][0] == "run"] == ["b", "c", "d"]
    assert out["b"][1].startswith("upstream a is running now")


def test_schedules():
    assert cronlib.check_schedule(" 0  3 * * * ") == "0 3 * * *"
    assert cronlib.check_schedule("@daily") == "@daily"
    for bad in ("0 3 * *", "61 3 * * *", "0 3 * * * *", "@reboot", "nightly", ""):
        with pytest.raises(EaglelabError, match="not a cron schedule"):
            cronlib.check_schedule(bad)
    import datetime as dt
    start = dt.datetime(2026, 11, 29, 21, 0, tzinfo=dt.UTC)
    assert [t.isoformat() for t in cronlib.next_times("0 3 * * *", start, 2)] == [
        "2026-11-30T03:00:00+00:00", "2026-12-01T03:00:00+00:00"]
    with pytest.raises(EaglelabError, match="'%'"):
        cronlib.fire_command(target="pipeline", python="/v/bin/python", repo=Path("/r"), conf_dir=Path("/c/50%"),
                             profile=None, logs_dir=Path("/l"))


def test_prune_keeps_the_newest_firings(tmp_path: Path):
    ids = [f"2026112{d}T030001-pipeline-{d}abc" for d in range(1, 6)]
    for i in ids:
        (tmp_path / f"{i}.log").write_text("x")
        (tmp_path / f"{i}.json").write_text("{}")
    (tmp_path / "cron.out").write_text("index")
    assert cronlib.prune(tmp_path, keep=2) == ids[:3]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["cron.out"] + [f"{i}{e}" for i in ids[3:] for e in (".log", ".json")])


def test_a_webhook_url_from_the_environment(tmplab, monkeypatch):
    from eaglelab import config
    tmplab.write_lab("notify:\n  webhooks:\n    - {url_env: EAGLELAB_TEST_HOOK, format: slack}\n")
    tmplab.write_pipeline("stages:\n  a: {host: local, command: [\"true\"]}\n")
    hook = config.load(tmplab.conf).lab.notify.webhooks[0]
    monkeypatch.delenv("EAGLELAB_TEST_HOOK", raising=False)
    with pytest.raises(config.ConfigError, match="EAGLELAB_TEST_HOOK"):
        hook.resolved_url()
    monkeypatch.setenv("EAGLELAB_TEST_HOOK", "https://hooks.example.invalid/services/T0/B0/secret")
    assert hook.resolved_url().endswith("/secret")
    assert notify.redact_url(hook.resolved_url()).startswith("https://hooks.example.invalid/…#")
    tmplab.write_lab("notify:\n  webhooks:\n    - {format: slack}\n")
    with pytest.raises(config.ConfigError, match="url_env"):
        config.load(tmplab.conf)


class Redirector:
    """A webhook that answers every POST with a redirect to its own /caught, and records /caught."""

    def __init__(self, code: int):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        self.caught: list[str] = []
        me = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self):
                if self.path.startswith("/caught"):
                    me.caught.append(self.command)
                    self.send_response(200)
                else:
                    self.send_response(code)
                    self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/caught")
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _any

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_webhooks_follow_no_redirect_and_post_only_to_http(tmplab):
    """O-7: a webhook that redirects is a failed delivery, not a request sent where it points; a
    file:/ftp: URL is refused when the config loads (url:) or when it is read (url_env:)."""
    hooks = [Redirector(302), Redirector(307)]
    try:
        tmplab.write_pipeline("stages:\n  a: {host: local, command: [\"true\"]}\n")
        tmplab.write_lab("notify:\n  webhooks:\n" + "".join(f"    - {{url: '{h.url}'}}\n" for h in hooks))
        p = tmplab.lab("notify", "test", check=False)
        assert p.returncode == 1, p.stdout + p.stderr
        assert p.stdout.count("redirect not followed") == 2, p.stdout
        assert [h.caught for h in hooks] == [[], []]  # nothing reached where the redirect pointed
    finally:
        for h in hooks:
            h.close()
    tmplab.write_lab("notify:\n  webhooks:\n    - {url: 'file:///etc/passwd'}\n")
    p = tmplab.lab("notify", "test", check=False)
    assert p.returncode != 0 and "notify.webhooks" in p.stderr and "scheme file: is not allowed" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    tmplab.write_lab("notify:\n  webhooks:\n    - {url_env: EAGLELAB_TEST_HOOK}\n")
    p = subprocess.run([str(REPO / "bin" / "lab"), "notify", "test"], capture_output=True, text=True, timeout=60,
                       env={**tmplab.env(), "EAGLELAB_TEST_HOOK": "ftp://127.0.0.1/x"})
    assert p.returncode != 0 and "$EAGLELAB_TEST_HOOK" in p.stderr + p.stdout and "scheme ftp:" in p.stderr + p.stdout


def test_log_text_is_inert_in_slack_mrkdwn(tmplab):
    """O-8: a stage's last words reach Slack as text: `<!channel>` pings nobody, a `<url|label>`
    in a log is no link, `&` stays `&`; only the status page link is a link."""
    r = Receiver()
    try:
        tmplab.write_lab(f"notify:\n  status_url: http://127.0.0.1:8765/?a=1&b=2\n  webhooks:\n"
                         f"    - {{url: '{r.url}/s', format: slack}}\n")
        tmplab.write_pipeline("""\
            stages:
              loud:
                host: local
                command: ["${python}", "-c", "raise RuntimeError('<!channel> see <http://evil.example|the fix> & @here')"]
            """)
        tmplab.lab("run", "loud", check=False)
        tmplab.lab("status")  # whoever polls first queues the event
        (got,) = wait_for(lambda: r.json("/s"), timeout=30)
    finally:
        _kill_drainer(tmplab)
        r.close()
    texts = [got["text"], got["blocks"][0]["text"]["text"], got["blocks"][1]["elements"][0]["text"]]
    words = " ".join(texts)
    assert "&lt;!channel&gt; see &lt;http://evil.example|the fix&gt; &amp; @\u200bhere" in words, texts
    assert "<!" not in words and "<http://evil" not in words and "@here" not in words
    assert texts[2].endswith("<http://127.0.0.1:8765/?a=1&amp;b=2|status page>"), texts[2]


def test_a_registry_deleted_under_a_following_lab_run_is_rebuilt_in_place_and_no_event_is_lost(hooked):
    """`rm logs/registry.sqlite` while `lab run` follows a stage: the follower used to exit 2 (no
    such table), and the run's end, heard by nobody, sent no webhook. The registry is rebuilt in
    place (the live runs this process knew kept, the hosts fill in the rest), the follower carries
    on to the end, and the end is news: one `completed` webhook."""
    lab, receiver = hooked
    lab.write_pipeline("""\
        stages:
          longer:
            host: local
            command: ["${python}", "-m", "eaglelab.stages.tick", "--steps", "30", "--delay", "0.1"]
        """)
    follower = subprocess.Popen([str(REPO / "bin" / "lab"), "run", "longer"], env=lab.env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        state = lambda: next(iter(lab.work.glob("runs/*/state.json")), None)
        lab.wait_for(lambda: (s := state()) and ((json.loads(s.read_text()).get("progress") or {}).get("n") or 0) >= 3,
                     timeout=30, interval=0.05)
        (lab.logs / "registry.sqlite").unlink()  # as a person would: its -wal and -shm stay behind
        out, err = follower.communicate(timeout=90)
    finally:
        follower.kill()
    assert follower.returncode == 0 and "Traceback" not in err, out + err
    assert "rebuilt in place" in err, err
    (run,) = lab.runs("longer")
    assert run["state"] == "completed", run
    assert notifications(lab) == [("completed", "longer")]
    got = lab.wait_for(lambda: receiver.json("/g"), timeout=30)
    assert [(g["event"], g["run_id"]) for g in got] == [("completed", run["id"])]
