"""A real browser (Playwright driving Debian's Chromium) against `lab web` serving a temporary lab
while a real `tick` stage, started with `lab run --detach`, counts: the page shows its progress
change without a reload, the lost-connection banner appears when the server goes and leaves when
it is back. Screenshots go to tests/output/."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

from playwright import sync_api as playwright_api

from conftest import LAB, REPO

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OUT = REPO / "tests" / "output"

PIPELINE = """\
vars:
  data: {data}
stages:
  tick:
    description: counts with a tqdm bar
    host: local
    command: ["${{python}}", "-m", "eaglelab.stages.tick", "--steps", "80", "--delay", "0.25",
              "--output", "${{data}}/tick.json"]
  tock:
    description: runs after tick
    host: local
    depends_on: [tick]
    command: ["${{python}}", "-m", "eaglelab.stages.tick", "--steps", "3", "--delay", "0.1"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_web(tmplab, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([str(LAB), "web", "--port", str(port), "--refresh", "0.5"], env=tmplab.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"lab web did not answer: {proc.stdout.read().decode()}")


def stop_web(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_live_page_during_a_real_run(tmplab):
    tmplab.write_profile("test", "vars: {}\n")
    tmplab.write_pipeline(PIPELINE.format(data=tmplab.root / "data"))
    OUT.mkdir(parents=True, exist_ok=True)
    port = free_port()
    tmplab.lab("run", "tick", "--detach")
    web = start_web(tmplab, port)
    try:
        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.goto(f"http://127.0.0.1:{port}/")
                page.evaluate("window.__sameDocument = true")  # gone if the page reloads
                cell = page.locator('.cell[data-stage="tick"]')
                n_text = cell.locator(".ptext .pn")
                n_text.wait_for(timeout=20000)
                assert cell.get_attribute("data-state") == "running"
                first = int(n_text.inner_text())
                page.wait_for_function(
                    "n => { const e = document.querySelector('.cell[data-stage=\"tick\"] .ptext .pn');"
                    " return e && parseInt(e.textContent) >= n + 4; }", arg=first, timeout=20000)
                second = int(n_text.inner_text())
                assert second >= first + 4
                assert page.evaluate("window.__sameDocument") is True  # updated without a reload
                assert re.search(r"/80 step", cell.locator(".ptext").inner_text())
                assert cell.locator("progress").get_attribute("max") == "80"
                assert cell.locator(".eta").inner_text().startswith("ETA ")
                assert "Ticking" in cell.locator(".phase").inner_text()  # the bar's label, no phase yet
                assert page.locator('.cell[data-stage="tock"]').get_attribute("data-state") == "pending"
                page.locator('figure.plot svg.chart').first.wait_for(timeout=20000)  # the rate plot appears
                assert page.locator("#conn-lost").is_hidden()
                page.screenshot(path=str(OUT / "web_live.png"), full_page=True)

                # the server goes away: the banner says so; it comes back: the banner leaves
                stop_web(web)
                page.locator("#conn-lost").wait_for(state="visible", timeout=15000)
                assert page.locator("#conn-text").inner_text() == "offline"
                page.screenshot(path=str(OUT / "web_lost.png"))
                web = start_web(tmplab, port)
                page.locator("#conn-lost").wait_for(state="hidden", timeout=15000)
                assert page.locator("#conn-text").inner_text() == "live"
                assert page.evaluate("window.__sameDocument") is True

                # the run page of the same run: log lines and its progress
                run_id = cell.get_attribute("data-run")
                page.goto(f"http://127.0.0.1:{port}/runs/{run_id}")
                assert "tick: counting to 80" in page.locator("#log").inner_text()
                page.screenshot(path=str(OUT / "web_run.png"), full_page=True)
            finally:
                browser.close()
    finally:
        stop_web(web)
        tmplab.lab("stop", "tick", check=False)


def test_lab_web_refuses_clearly(tmplab):
    """--read-token without a token, and a port in use: errors that say what to do."""
    tmplab.write_pipeline(PIPELINE.format(data=tmplab.root / "data"))
    env = {k: v for k, v in tmplab.env().items() if k != "EAGLELAB_TOKEN"}
    p = subprocess.run([str(LAB), "web", "--read-token"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--read-token needs a token: set $EAGLELAB_TOKEN" in p.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = subprocess.run([str(LAB), "web", "--port", str(port)], env=env, capture_output=True, text=True,
                           timeout=60)
    assert p.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in p.stderr and "--port" in p.stderr


def test_lab_web_binds_loopback_by_default(tmplab):
    tmplab.write_pipeline(PIPELINE.format(data=tmplab.root / "data"))
    port = free_port()
    web = start_web(tmplab, port)
    try:
        with socket.socket() as s:  # the same port on another local address is free: not bound there
            s.bind(("127.0.0.2", port))
    finally:
        stop_web(web)
    assert "lab web: http://127.0.0.1:" in web.stdout.read().decode()
