"""Regenerate docs/status-page.png: the status page during a real run.

A temporary lab (two hosts, both this machine) runs a six-stage pipeline of small real stages once,
so the ETAs have history, then runs it again and photographs the page while `extract` loads its
32 "shards" with the seeds' drift scaled down 10x (1.6 -> 2.9 s per shard).

  .venv/bin/python docs/status_page_shot.py [OUT.png]
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LAB = str(REPO / "bin" / "lab")
DRIFT = ("import sys, time\nfrom tqdm import tqdm\n"
         "for i in tqdm(range(32), desc='Loading safetensors checkpoint shards', unit='shard', mininterval=0,"
         " file=sys.stderr):\n    time.sleep(1.6 + 1.3 * i / 31)\n")


def tick(steps: int, delay: float, **kw) -> dict:
    return {"command": ["${python}", "-m", "eaglelab.stages.tick", "--steps", str(steps), "--delay", str(delay)], **kw}


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "docs" / "status-page.png")
    root = Path(tempfile.mkdtemp(prefix="status-shot."))
    conf = root / "conf"
    (conf / "profiles").mkdir(parents=True)
    hosts = {h: {"reach": "local", "work_dir": str(root / h), "repo_dir": str(REPO), "python": sys.executable,
                 "gpus": 2} for h in ("gpu1", "gpu2")}
    (conf / "lab.yaml").write_text(yaml.safe_dump({"profile": "seeds", "logs_dir": str(root / "logs"),
                                                   "hosts": hosts}))
    (conf / "profiles" / "seeds.yaml").write_text("description: screenshot\n")
    stages = {
        "synth": tick(12, 0.1, host="gpu1"),
        "prepare": tick(16, 0.1, host="gpu1", depends_on=["synth"]),
        "extract": {"host": "gpu1", "depends_on": ["prepare"], "command": ["${python}", "-c", DRIFT]},
        "vocab": tick(10, 0.1, host="gpu1", depends_on=["extract"]),
        "train": tick(60, 0.1, host="gpu2", depends_on=["vocab"]),
        "eval": tick(20, 0.1, host="gpu2", depends_on=["train"]),
    }
    (conf / "pipeline.yaml").write_text(yaml.safe_dump({"vars": {}, "stages": stages}))
    env = {**os.environ, "EAGLELAB_CONF": str(conf)}
    env.pop("EAGLELAB_PROFILE", None)

    def lab(*args: str) -> None:
        subprocess.run([LAB, *args], env=env, check=True, stdout=subprocess.DEVNULL)

    lab("pipeline", "--quiet")  # history for the ETAs
    lab("run", "synth", "prepare", "--force", "--quiet")
    lab("run", "extract", "--force", "--detach")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web = subprocess.Popen([LAB, "web", "--port", str(port), "--refresh", "0.5"], env=env, start_new_session=True)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2) as r:
                    st = json.load(r)
                run = next(r for r in st["runs"] if r["stage"] == "extract" and r["state"] == "running")
                if ((run.get("log_state") or {}).get("progress") or {}).get("n", 0) >= 24:
                    break
            except (OSError, StopIteration):
                pass
            time.sleep(0.2)
        from playwright.sync_api import sync_playwright
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=args)
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_timeout(600)
            page.screenshot(path=str(out), full_page=True)
            browser.close()
        print(f"wrote {out}")
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)
        subprocess.run([LAB, "stop", "extract"], env=env, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
