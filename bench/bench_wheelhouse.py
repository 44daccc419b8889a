"""The wheelhouse: `lab wheelhouse`'s download of a lock for this machine's platform (the tags asked
of this python, as of a host's), then again from the cache; the baseline is a plain
`pip download --no-deps -r LOCK` for the running interpreter, in the same run.

    .venv/bin/python bench/bench_wheelhouse.py [--lock requirements.lock]

Downloads into a temporary folder, removed at the end (the full lock is about 1 GB).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "py")]

from eaglelab.control.transfers import wheelhouse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", default=str(REPO / "requirements.lock"))
    args = ap.parse_args()
    lock = Path(args.lock).resolve()
    facts = json.loads(subprocess.run([sys.executable, "-c", wheelhouse.PLATFORM_SCRIPT], capture_output=True,
                                      text=True, check=True).stdout)
    target = wheelhouse.target_from_facts(facts)
    tmp = Path(tempfile.mkdtemp(prefix="bench-wheelhouse-"))
    try:
        t0 = time.perf_counter()
        cold = wheelhouse.build(lock, target, tmp / "logs")
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        wheelhouse.build(lock, target, tmp / "logs")
        cached_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--disable-pip-version-check",
                        "--dest", str(tmp / "plain"), "-r", str(lock)], check=True, capture_output=True)
        plain_s = time.perf_counter() - t0
        plain_bytes = sum(p.stat().st_size for p in (tmp / "plain").iterdir())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"lock {lock.name}: {len(cold['files'])} wheels, {cold['bytes']:,} B for {target.key()}")
    print(f"lab wheelhouse, cold:   {cold_s:7.1f} s")
    print(f"lab wheelhouse, cached: {cached_s:7.3f} s")
    print(f"baseline: plain pip download --no-deps (this interpreter): {plain_s:7.1f} s, {plain_bytes:,} B "
          f"(wheelhouse/baseline {cold_s / plain_s:.2f}x)")


if __name__ == "__main__":
    main()
