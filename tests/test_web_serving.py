"""What makes the page safe to serve on a LAN: the Host allow-list, a token never logged nor echoed
into a URL, per-snapshot caching of /api/runs, and the snapshot's build-once cache never waiting
on itself (the deadlock a page that reads `status` from inside its own build used to hit)."""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading

import web_samples
from status_web import create_app, server
from status_web.snapshot import Snap

TRAIN = "train-20270114T200000-cccc"


def sample_app(**kw):
    app = create_app(source=lambda: web_samples.copy_of(web_samples.lab_status()), start=False,
                     clock=lambda: web_samples.NOW, **kw)
    app.extensions["eaglelab"].snapshot.refresh_now()
    return app


def test_a_build_that_reads_status_of_a_fresh_snap_answers():
    """A Snap from the refresher process has only bytes; the first page parses `status` from its
    own build. That used to take the lock cached() held: a deadlock."""
    body = json.dumps({"runs": [], "hosts": [{"name": "h"}]}).encode()
    snap = Snap(1, None, body, gzip.compress(body), '"e"', 0.0)
    out = {}
    t = threading.Thread(target=lambda: out.update(v=snap.cached("hosts", lambda: str(snap.status["hosts"]).encode())),
                         daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "cached() deadlocked on a build that reads snap.status"
    assert out["v"][0] == b"[{'name': 'h'}]" and gzip.decompress(out["v"][1]) == out["v"][0]
    # a build may also read another cached key of the same snapshot
    both = snap.cached("outer", lambda: snap.cached("inner", lambda: b"x")[0] + b"y")
    assert both[0] == b"xy" and snap.cache["inner"][0] == b"x"


def test_many_askers_one_build():
    snap = Snap(1, {}, b"{}", b"", '"e"', 0.0)
    builds, gate = [], threading.Event()

    def build():
        builds.append(1)
        gate.wait(5)
        return b"page"
    threads = [threading.Thread(target=lambda: snap.cached("k", build)) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert len(builds) == 1 and snap.cache["k"][0] == b"page"


def test_a_failed_build_is_not_cached_and_others_retry():
    snap = Snap(1, {}, b"{}", b"", '"e"', 0.0)
    calls = []

    def bad():
        calls.append(1)
        raise RuntimeError("template broke")
    for _ in range(2):
        try:
            snap.cached("k", bad)
        except RuntimeError:
            pass
    assert len(calls) == 2 and "k" not in snap.cache and not snap._building


def test_host_header_allow_list():
    c = sample_app(bind_host="10.77.0.5", allowed_hosts=["lab.example.org"]).test_client()
    for host in ("localhost", "localhost:8765", "127.0.0.1:8765", "[::1]:8765", "10.77.0.5:8765",
                 "LAB.example.org:8765"):
        assert c.get("/api/status", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example.com", "evil.example.com:8765", "127.0.0.1.evil.example.com", "10.77.0.6"):
        resp = c.get("/api/status", headers={"Host": host})
        assert resp.status_code == 421, host
        assert "web.allowed_hosts" in resp.get_json()["error"]
    # bound to every address: the wildcard is not a name anyone can be sent to
    c = sample_app(bind_host="0.0.0.0").test_client()
    assert c.get("/", headers={"Host": "0.0.0.0:8765"}).status_code == 421


def test_token_query_never_reaches_url_for_or_the_redirect():
    c = sample_app(token="s3cret", read_token=True).test_client()
    for path in (f"/runs/{TRAIN}?token=s3cret&run_id=x&partial=1", "/?token=s3cret&endpoint=y&x=1&x=2",
                 "/stages/train?token=s3cret&name=z"):
        resp = c.get(path)
        assert resp.status_code == 302, path
        loc = resp.headers["Location"]
        assert "s3cret" not in loc and "token" not in loc
    assert c.get("/?token=s3cret&x=1&x=2").headers["Location"] == "/?x=1&x=2"
    # extra arguments on any page, with or without the cookie, never give a 500
    c.get("/?token=s3cret")
    for path in ("/?run_id=1&endpoint=2", f"/runs/{TRAIN}?run_id=a&_external=1", "/hosts?partial=1&x=%00"):
        assert c.get(path).status_code == 200, path


def test_access_log_hides_the_token(caplog):
    seen = {}

    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"ok"]
    wrapped = server.AccessLog(app)
    with caplog.at_level(logging.INFO, logger="eaglelab.web.access"):
        wrapped({"REQUEST_METHOD": "GET", "PATH_INFO": "/hosts", "QUERY_STRING": "a=1&token=s3cret&TOKEN=x",
                 "REMOTE_ADDR": "127.0.0.1"}, lambda s, h, e=None: seen.setdefault("s", s))
    assert "s3cret" not in caplog.text and "TOKEN=x" not in caplog.text
    assert "/hosts?a=1&token=***&TOKEN=*** 200" in caplog.text
    assert server.redact_query("token=abc") == "token=***"


def test_api_run_is_cached_per_snapshot():
    app = sample_app()
    snapshot = app.extensions["eaglelab"].snapshot
    c = app.test_client()
    first = c.get(f"/api/runs/{TRAIN}").get_json()
    assert first["run"]["id"] == TRAIN
    assert ("api_run", TRAIN) in snapshot.current.cache
    snapshot.refresh_now()
    assert ("api_run", TRAIN) not in snapshot.current.cache  # a new snapshot: built again
    assert c.get(f"/api/runs/{TRAIN}").get_json() == first
    assert c.get("/api/runs/nope").status_code == 404


def _closed_by_server(s) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True


def test_slowloris_never_holds_the_page(tmplab):
    """O-2: 220 sockets from 127.0.0.1 each sending a header line now and then held all 200 of
    waitress's connections (each line reset its idle timeout): /api/status went unanswered. The
    real `lab web` answers during the attack, and one address keeps at most PER_CLIENT_UNSERVED
    connections that send no complete request."""
    import socket
    import time
    import urllib.request

    from test_web_browser import free_port, start_web, stop_web
    tmplab.write_pipeline('stages:\n  a: {host: local, command: ["true"]}\n')
    port = free_port()
    web = start_web(tmplab, port)
    slow = []
    try:
        for _ in range(220):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never the blank line
            slow.append(s)
        for s in slow:  # still trickling
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                pass
        began = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5) as r:
            assert r.status == 200 and b'"schema"' in r.read()
        assert time.monotonic() - began < 3
        time.sleep(0.5)
        still_open = sum(not _closed_by_server(s) for s in slow)
        assert still_open <= server.PER_CLIENT_UNSERVED, still_open
    finally:
        for s in slow:
            s.close()
        stop_web(web)


def test_a_request_that_takes_too_long_to_arrive_is_closed(monkeypatch):
    """The header-read bound: a request whose headers still trickle in REQUEST_READ_S after its
    first byte has its connection closed, however often a line arrives (here the bound is 1 s)."""
    import socket
    import time
    monkeypatch.setattr(server, "REQUEST_READ_S", 1)

    def app(environ, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]
    srv = server.make(app, "127.0.0.1", 0)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    s = socket.create_connection(("127.0.0.1", srv.effective_port), timeout=5)
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        began, closed = time.monotonic(), False
        while time.monotonic() - began < 4 and not closed:
            time.sleep(0.25)
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                closed = True
            closed = closed or _closed_by_server(s)
            s.setblocking(True)
        assert closed and 1 <= time.monotonic() - began < 3.5, time.monotonic() - began
    finally:
        from waitress import wasyncore
        s.close()
        srv.task_dispatcher.shutdown()
        wasyncore.close_all(srv._map)  # the loop ends with an empty map
        t.join(5)


def test_a_path_cannot_forge_an_access_log_line(tmplab):
    """O-10: waitress decodes %0A in a path; written as is, `GET /x%0A<a whole fake line>` put a
    line of the client's choosing in `lab web --access-log`'s output (a forged POST of a stop, say).
    Controls, line breaks, spaces and backslashes in a logged field are written as \\xNN."""
    import signal
    import socket
    import subprocess
    import urllib.request

    from conftest import LAB, wait_for
    from test_web_browser import free_port
    tmplab.write_pipeline('stages:\n  a: {host: local, command: ["true"]}\n')
    port = free_port()
    web = subprocess.Popen([str(LAB), "web", "--port", str(port), "--refresh", "5", "--access-log"],
                           env=tmplab.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _answers(port), timeout=30)
        forged = "127.0.0.1 POST /api/runs/a-1/stop 200 1.0ms"
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"GET /nope%0D%0A{forged.replace(' ', '%20')}%E2%80%A8x HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
                      .encode())
            s.recv(65536)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?after=1", timeout=5) as r:
            r.read()
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        out = web.communicate(timeout=30)[0].decode(errors="replace")
    assert "/api/status?after=1 200" in out, out  # the log was on
    lines = out.splitlines()
    assert not any(line.startswith(forged) or line.lstrip().startswith("127.0.0.1 POST") for line in lines), out
    (logged,) = [line for line in lines if "/nope" in line]
    assert "/nope\\x0d\\x0a127.0.0.1\\x20POST\\x20/api/runs/a-1/stop" in logged and logged.endswith("ms"), logged


def _answers(port: int) -> bool:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
