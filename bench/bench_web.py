"""GET /api/status latency under load: 50 hosts x 8 stages of state, 20 concurrent clients.

The lab is real where it matters: a temporary conf (50 hosts, 400 stages), a real SQLite registry
filled with 800 runs (running ones with a parser state of 256-sample bar histories and metric
curves), the real collect() and the real `lab web` server (waitress) in its own process,
refreshing its snapshot every 2 s while the clients hammer it. Only the hosts are not asked
(collect(refresh=False)): this measures the page, not ssh.

BENCH_REFRESHER=thread runs the refresh in a thread of the serving process instead (to compare).

Printed: p50/p99/max and requests/s per route, with two baselines measured in the same run:
  /healthz  the server's floor (a constant response): api p99 / healthz p99 is the ratio to it;
  /naive    what the snapshot avoids: collect() + json.dumps on every request (bench-only route).
The machine's load average is printed too: the team shares its 2 cores.

  python bench/bench_web.py [--seconds 8] [--clients 20]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "py"), str(REPO)]

HOSTS, STAGES = 50, 8
STAGE_NAMES = ("synth", "prepare", "serve", "extract", "vocab", "train", "eval", "report")


def build_lab(root: Path) -> Path:
    """conf + registry for 50 hosts x 8 stages; returns the conf dir."""
    import yaml

    from eaglelab.control.registry import Registry
    from eaglelab.fsutil import utcnow_iso

    conf = root / "conf"
    (conf / "profiles").mkdir(parents=True)
    hosts = {f"gpu{h:02d}": {"reach": "local", "work_dir": str(root / "work" / f"gpu{h:02d}"), "gpus": 8}
             for h in range(HOSTS)}
    (conf / "lab.yaml").write_text(yaml.safe_dump({"profile": "none", "logs_dir": str(root / "logs"),
                                                   "hosts": hosts}))
    stages = {}
    for h in range(HOSTS):
        prev = None
        for s in STAGE_NAMES:
            name = f"{s}-{h:02d}"
            stages[name] = {"host": f"gpu{h:02d}", "command": ["true"], "depends_on": [prev] if prev else []}
            prev = name
    (conf / "pipeline.yaml").write_text(yaml.safe_dump({"vars": {}, "stages": stages}))

    rng = random.Random(7)
    now = time.time()
    reg = Registry(root / "logs" / "registry.sqlite")
    runs = []
    for h in range(HOSTS):
        t = now - 6 * 3600
        running_at = rng.randrange(1, STAGES)  # stages before it completed, this one running, the rest pending
        for i, s in enumerate(STAGE_NAMES):
            name, host = f"{s}-{h:02d}", f"gpu{h:02d}"
            if i > running_at:
                break
            for attempt in (0, 1):  # an older run and the latest
                dur = rng.uniform(300, 2400)
                state = "running" if (i == running_at and attempt == 1) else \
                    ("failed" if attempt == 0 and rng.random() < 0.3 else "completed")
                hist = [[round(k * (16 + 13 * k / 256)), k] for k in range(256)]
                log_state = {"schema": 1, "state": state, "failure": None, "phase": "extraction",
                             "progress": {"label": "Extracting", "n": 255, "total": 512, "unit": "shard",
                                          "rate_s_per_it": 28.0, "elapsed_s": hist[-1][0], "eta_s": 7000.0,
                                          "history": hist},
                             "phases": [{"name": "weights_loading", "duration_s": 900.0}],
                             "metrics": {"train/loss": [[k, 5 / (1 + k / 50)] for k in range(200)]},
                             "lines": 100000, "bad_lines": 0}
                if state == "failed":
                    log_state["failure"] = {"reason": "cuda_oom", "message": "CUDA out of memory", "line": 99}
                runs.append({"id": f"{name}-{attempt}", "stage": name, "host": host, "profile": "none",
                             "kind": "job", "state": state, "exit_code": None if state == "running" else
                             (0 if state == "completed" else 1), "started_at": utcnow_iso(t),
                             "ended_at": None if state == "running" else utcnow_iso(t + dur),
                             "duration_s": dur, "run_dir": str(root / "work" / host / "runs" / f"{name}-{attempt}"),
                             "pid": 1000 + len(runs), "log_state": log_state})
                t += dur
    reg.upsert_many(runs)
    for h in range(HOSTS):
        reg.sync_host(f"gpu{h:02d}", {"gpus": [{"index": g, "name": "NVIDIA H100", "utilization_pct": 90.0,
                                               "memory_used_mib": 60000, "memory_total_mib": 81559}
                                              for g in range(8)], "free_disk_bytes": 1 << 40})
    return conf


def serve(conf: str, port: int, refresh_s: float) -> None:
    """The server process: `lab web`'s app and server, plus the bench-only /naive route."""
    from flask import Response

    from eaglelab.control.lab import Lab
    from eaglelab.control.status import collect
    from status_web import create_app, server

    lab = Lab.load(conf)
    source = lambda: collect(lab, refresh=False).to_json()
    app = create_app(lab, refresh_s=refresh_s, refresher=os.environ.get("BENCH_REFRESHER", "process"),
                     ask_hosts=False)
    app.add_url_rule("/naive", "naive", lambda: Response(json.dumps(source()), mimetype="application/json"))
    import logging
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server.make(app, "127.0.0.1", port).run()


def load(port: int, path: str, clients: int, seconds: float, gz: bool = True, keepalive: bool = True) -> dict:
    """Closed loop: each of `clients` sends its next request as soon as the last one is answered, on
    its kept-alive connection (as a polling browser does; keepalive=False: a new one each time), with
    Accept-Encoding: gzip as browsers and `requests` send it (gz=False: as plain curl does).
    The clients are coroutines of one asyncio loop in this process: no client-side thread contention
    inflates the server's figures."""
    return asyncio.run(_load(port, path, clients, seconds, gz, keepalive))


async def _load(port, path, clients, seconds, gz, keepalive) -> dict:
    lat: list[float] = []
    sizes: list[int] = []
    errors = [0]
    request = (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               + ("Accept-Encoding: gzip\r\n" if gz else "")
               + ("" if keepalive else "Connection: close\r\n") + "\r\n").encode()
    stop = time.perf_counter() + seconds

    async def client():
        conn = None
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                reader, writer = conn
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                body = await reader.readexactly(length)
                if not keepalive or re.search(rb"(?i)connection: *close", head):
                    writer.close()
                    conn = None
                ok = status == 200
            except (OSError, asyncio.IncompleteReadError, AttributeError, ValueError):
                ok, body, conn = False, b"", None
            if ok:
                lat.append(time.perf_counter() - t0)
                sizes.append(len(body))
            else:
                errors[0] += 1
        if conn is not None:
            conn[1].close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    lat.sort()
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [float("nan")] * 99
    return {"path": path, "n": len(lat), "errors": errors[0], "rps": len(lat) / wall, "p50_ms": 1000 * q[49],
            "p99_ms": 1000 * q[98], "max_ms": 1000 * lat[-1] if lat else float("nan"),
            "bytes": int(statistics.median(sizes)) if sizes else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--refresh", type=float, default=2.0, help="the server's refresh interval (lab web's default)")
    ap.add_argument("--serve", nargs=2, metavar=("CONF", "PORT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve[0], int(a.serve[1]), a.refresh)
        return
    with tempfile.TemporaryDirectory(prefix="bench_web.") as tmp:
        t0 = time.perf_counter()
        conf = build_lab(Path(tmp))
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(conf), str(port),
                                   "--refresh", str(a.refresh)],
                                  env={**os.environ, "EAGLELAB_TOKEN": ""})
        try:
            deadline = time.time() + 60
            while True:
                try:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                    c.request("GET", "/api/status")
                    if c.getresponse().status == 200:
                        break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise SystemExit("server did not start")
                time.sleep(0.2)
            print(f"lab: {HOSTS} hosts x {STAGES} stages, built in {time.perf_counter() - t0:.1f} s; "
                  f"{a.clients} concurrent clients, {a.seconds:.0f} s per route, refresh every {a.refresh:g} s, "
                  f"{len(os.sched_getaffinity(0))} CPUs, "
                  f"load average {os.getloadavg()[0]:.1f}")
            results = {}
            for name, path, secs, gz, ka in (("/healthz", "/healthz", a.seconds, True, True),
                                             ("/api/status", "/api/status", a.seconds, True, True),
                                             ("(new conn)", "/api/status", a.seconds / 2, True, False),
                                             ("(no gzip)", "/api/status", a.seconds / 2, False, True),
                                             ("/", "/", a.seconds, True, True),
                                             ("/metrics", "/metrics", a.seconds / 2, True, True),
                                             ("/naive", "/naive", a.seconds / 2, True, True)):
                load(port, path, a.clients, 1.0, gz, ka)  # warm up
                results[name] = r = load(port, path, a.clients, secs, gz, ka)
                print(f"  {name:<12} n={r['n']:<6} {r['rps']:7.0f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                      f"p99 {r['p99_ms']:7.1f} ms  max {r['max_ms']:7.1f} ms  {r['bytes'] / 1024:7.0f} KiB"
                      f"{'  errors ' + str(r['errors']) if r['errors'] else ''}")
            api, floor, naive = results["/api/status"], results["/healthz"], results["/naive"]
            print(f"/api/status p99 = {api['p99_ms']:.1f} ms (goal < 50 ms): {api['p99_ms'] / floor['p99_ms']:.2f}x "
                  f"the server's floor (/healthz), {naive['p99_ms'] / api['p99_ms']:.1f}x faster than collect() "
                  f"per request (/naive)")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
