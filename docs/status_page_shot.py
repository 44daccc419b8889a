"""Regenerate docs/status-page.png: the status page after `make demo`, outcome banner first.

`make demo` leaves its status page up (http://127.0.0.1:8765/, or DEMO_PORT). This opens it in
Debian's Chromium through Playwright, waits until the banner shows a measured verdict, and takes a
full-page screenshot.

  make demo && .venv/bin/python docs/status_page_shot.py [--url http://127.0.0.1:8765/] [OUT.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parents[1]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(REPO / "docs" / "status-page.png"))
    ap.add_argument("--url", default="http://127.0.0.1:8765/")
    ap.add_argument("--timeout", type=float, default=120, help="seconds to wait for the verdict")
    a = ap.parse_args()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
            page.goto(a.url)
            page.wait_for_function("() => { const v = document.getElementById('verdict');"
                                   " return v && v.textContent !== 'NOT MEASURED'; }", timeout=a.timeout * 1000)
            page.wait_for_timeout(500)
            page.screenshot(path=a.out, full_page=True)
            print(f"wrote {a.out}: verdict {page.inner_text('#verdict')}")
        finally:
            browser.close()


if __name__ == "__main__":
    main()
