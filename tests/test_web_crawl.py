"""The real `lab web` process, started as docs/web.md says (`lab web --port P`), crawled by a real
browser (Playwright + Debian's Chromium): every top-level page as the first reader of a fresh
snapshot, then every link the pages show (navigation, runs, stages, hosts), during a live pipeline
and after it. Each page must answer (HTTP 200) within a generous timeout; the durations are
recorded in tests/output/web_crawl.json, never asserted. Also: the Host allow-list and bounded
threads as the real server applies them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from urllib.parse import urldefrag, urlparse

from playwright import sync_api as playwright_api

from conftest import LAB, wait_for
from test_web_browser import ARGS, CHROMIUM, OUT, free_port, start_web, stop_web

ANSWER_TIMEOUT_MS = 10_000  # an answer must come; how fast is recorded, not asserted
REFRESH_S = 0.5

PIPELINE = """\
stages:
  tick:
    description: counts with a tqdm bar
    host: local
    command: ["${{python}}", "-m", "eaglelab.stages.tick", "--steps", "60", "--delay", "0.25",
              "--output", "{data}/tick.json"]
  svc:
    description: a service that says it is ready and then serves
    kind: service
    host: local
    command: ["${{python}}", "-c", "import time; print('Application startup complete', flush=True); time.sleep(900)"]
    ready:
      log_regex: "Application startup complete"
      timeout_s: 60
  tock:
    description: runs after tick, with the service up
    host: local
    depends_on: [tick]
    needs: [svc]
    command: ["${{python}}", "-m", "eaglelab.stages.tick", "--steps", "3", "--delay", "0.1"]
"""


def etag(base: str) -> str:
    with urllib.request.urlopen(f"{base}/api/status", timeout=10) as r:
        return r.headers["ETag"]


def fresh_snapshot(base: str) -> None:
    """Wait until the server holds a snapshot no page has read yet (/api/status sends its bytes
    without parsing them, so it reads nothing a page would)."""
    before = etag(base)
    wait_for(lambda: etag(base) != before, timeout=30, interval=0.1)


def crawl(page, base: str, phase: str) -> list[dict]:
    """Top-level pages first (each after a fresh snapshot), then every same-origin link found on
    the HTML pages, breadth first, each once, each after a fresh snapshot too."""
    page.goto(f"{base}/", timeout=ANSWER_TIMEOUT_MS)
    nav = [a for a in page.eval_on_selector_all("header nav a", "as => as.map(a => a.getAttribute('href'))")]
    assert {"/", "/hosts", "/api/status", "/metrics"} <= set(nav)
    queue, seen, visits = list(nav), set(), []
    while queue:
        href = urldefrag(queue.pop(0))[0]
        if not href or href in seen or not href.startswith("/") or href.startswith("/static/"):
            continue
        seen.add(href)
        fresh_snapshot(base)
        t0 = time.monotonic()
        resp = page.goto(base + href, timeout=ANSWER_TIMEOUT_MS, wait_until="domcontentloaded")
        took = time.monotonic() - t0
        assert resp is not None and resp.status == 200, f"{phase}: {href} -> {resp and resp.status}"
        final = urlparse(page.url).path
        visits.append({"phase": phase, "href": href, "final": final, "status": resp.status,
                       "took_s": round(took, 3)})
        if "text/html" in (resp.headers.get("content-type") or ""):
            queue += page.eval_on_selector_all("a[href]", "as => as.map(a => a.getAttribute('href'))")
    return visits


def test_crawl_the_real_server_during_and_after_a_pipeline(tmplab):
    tmplab.write_pipeline(PIPELINE.format(data=tmplab.root / "data"))
    OUT.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    pipe = subprocess.Popen([str(LAB), "pipeline", "--quiet"], env=tmplab.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    web = start_web(tmplab, port)
    visits: list[dict] = []
    try:
        wait_for(lambda: any(r["stage"] == "tick" and r["state"] == "running"
                             for r in json.load(urllib.request.urlopen(f"{base}/api/status"))["runs"]), 60)
        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                live = crawl(page, base, "live")
                states = {r["stage"]: r["state"] for r in json.load(urllib.request.urlopen(f"{base}/api/status"))["runs"]}
                assert states.get("tick") == "running", "the live crawl outlasted the tick stage: lengthen it"
                assert any(v["href"].startswith("/runs/tick-") for v in live)
                visits += live
                out, _ = pipe.communicate(timeout=300)
                assert pipe.returncode == 0, out.decode()
                after = crawl(page, base, "after")
                assert {v["href"].split("-")[0] for v in after if v["href"].startswith("/runs/")} >= \
                    {"/runs/tick", "/runs/tock", "/runs/svc"}
                visits += after
            finally:
                browser.close()
    finally:
        stop_web(web)
        if pipe.poll() is None:
            os.killpg(pipe.pid, 9)
        tmplab.lab("stop", "svc", check=False)
    slowest = max(visits, key=lambda v: v["took_s"])
    (OUT / "web_crawl.json").write_text(json.dumps({"pages": len(visits), "slowest": slowest,
                                                    "visits": visits}, indent=1))
    print(f"crawled {len(visits)} pages; slowest {slowest['href']} ({slowest['phase']}) {slowest['took_s']} s")
    for top in ("/", "/hosts", "/api/status", "/metrics"):
        assert sum(v["href"] == top for v in visits) == 2  # once live, once after


def test_real_server_refuses_foreign_host_headers_and_keeps_threads_bounded(tmplab):
    tmplab.write_pipeline(PIPELINE.format(data=tmplab.root / "data"))
    port = free_port()
    web = start_web(tmplab, port)
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/status", headers={"Host": "evil.example:80"})
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("a foreign Host header was answered")
        except urllib.error.HTTPError as e:
            assert e.code == 421 and b"web.allowed_hosts" in e.read()
        threads = lambda: len(os.listdir(f"/proc/{web.pid}/task"))
        before = threads()
        idle = []
        try:
            for _ in range(150):  # idle keep-alive clients that never send a request
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                idle.append(s)
            time.sleep(1)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/hosts", timeout=10) as r:
                assert r.status == 200
            assert threads() <= before + 2, f"threads grew with idle connections: {before} -> {threads()}"
        finally:
            for s in idle:
                s.close()
    finally:
        stop_web(web)
