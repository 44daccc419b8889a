"""Parser and tailer benchmarks: throughput against grep, memory as the log grows, live latency.

    .venv/bin/python bench/bench_parse.py [--mb 300] [--latency-n 200]

Prints figures (no pass/fail):
1. Throughput of `lab parse`'s core (eaglelab.host.tail.whole.parse_file) on a generated tqdm-heavy
   log (mostly \\r frames of several bars, some log and metric lines), on a line-heavy log (a busy
   vLLM server's, made from real fixture lines, no frames), and on a 50 MB vLLM server log made
   from the demo's own server log (vllm_server: startup, access lines, stats and spec-decoding
   metrics, a worker's traceback and the shutdown), each beside `grep -c` over the same file in
   the same run, as a ratio; and once line by line without the prefilter (the baseline), with a
   check that both give the same state.
2. Peak RSS of a fresh process parsing logs of growing size: flat means constant memory.
3. Latency from a frame written to output.log to state.json showing it, with follow_run running
   in another process (as under jobwrap): p50 / p95 / max over --latency-n updates.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

BAR = "█▏▎▍▌▋▊▉"


def tqdm_heavy(path: Path, mb: int, seed: int = 0) -> None:
    """A training log as tqdm writes it to a file: long runs of \\r frames, a few real lines."""
    rnd = random.Random(seed)
    target = mb * 1024 * 1024
    with open(path, "w", encoding="utf-8", newline="") as f:
        written, step, epoch = 0, 0, 0
        f.write("INFO 11-29 20:00:00 [default_loader.py:267] Starting to load model tiny...\n")
        for n in range(65):
            f.write(f"\rLoading safetensors checkpoint shards: {100 * n // 64:3d}% Completed | {n}/64 "
                    f"[{n * 27 // 60:02d}:{n * 27 % 60:02d}<{(64 - n) * 27 // 60:02d}:{(64 - n) * 27 % 60:02d}, 27.81s/it]")
        f.write("\n")
        while written < target:
            buf = []
            total = 10000
            for _ in range(2000):
                step += 1
                n = step % total
                pct = 100 * n // total
                fill = BAR[0] * (pct // 10) + " " * (10 - pct // 10)
                el, rem = step // 15, (total - n) // 15
                buf.append(f"\rTraining:  {pct:3d}%|{fill}| {n}/{total} [{el // 60:02d}:{el % 60:02d}<"
                           f"{rem // 60:02d}:{rem % 60:02d}, {14 + rnd.random():.2f}it/s, loss={rnd.random() * 3:.4f}, lr=1.00e-04]")
            buf.append(f"\n[20:{step // 60 % 60:02d}:{step % 60:02d}] INFO     train/loss={rnd.random() * 3:.3f}, "
                       f"train/full_acc_0={rnd.random():.3f}, profile/tokens_per_s=1.23e+04, epoch={epoch}, "
                       f"lr=1.00e-04, global_step={step}\n")
            s = "".join(buf)
            f.write(s)
            written += len(s.encode())
        f.write("Training epoch 1/1 completed\n")


FIXTURES = ROOT / "tests" / "fixtures" / "logs"


def _fixture_line(rel: str, lineno: int) -> str:
    return (FIXTURES / rel).read_text(encoding="utf-8").splitlines()[lineno - 1]


def line_heavy(path: Path, mb: int, seed: int = 1, per_s: int = 100) -> None:
    """A busy vLLM server's log made from real fixture lines: the recorded CPU server's startup
    (tests/fixtures/logs/recorded/vllm_cpu_tiny_server.log up to `Application startup complete.`),
    then per second of serving per_s requests, each an access line and a `Finished request` line
    (its own request id), an engine stats line every 10 s, and now and then a request that fails
    (an ERROR line and its 404: public/vllm_request_errors_server_lives.log). Ports, ids, times and
    figures vary; the words are the fixtures'."""
    rnd = random.Random(seed)
    target = mb * 1024 * 1024
    startup = (FIXTURES / "recorded" / "vllm_cpu_tiny_server.log").read_text(encoding="utf-8").splitlines()[:103]
    access = _fixture_line("recorded/vllm_cpu_tiny_server.log", 104)        # INFO:     127.0.0.1:41564 - "POST ...
    finished = _fixture_line("public/vllm_v0_stats_pending.log", 2)         # INFO 02-01 06:36:05 ... Finished request cmpl-<hex>-0.
    stats = _fixture_line("public/vllm_stats_apiserver.log", 1)             # (APIServer pid=3646) INFO 05-19 10:13:11 [loggers.py:271] Engine 000: ...
    error, notfound = (_fixture_line("public/vllm_request_errors_server_lives.log", k) for k in (4, 5))
    port = re.compile(r"127\.0\.0\.1:\d+")
    hms = re.compile(r"\d\d:\d\d:\d\d")
    req = re.compile(r"cmpl-[0-9a-f]{32}")
    figs = re.compile(r"throughput: [\d.]+ tokens/s, Avg generation throughput: [\d.]+")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(startup) + "\n")
        written, sec = 0, 0
        while written < target:
            sec += 1
            t = f"{10 + sec // 3600 % 12:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
            out = []
            for _ in range(per_s):
                out.append(port.sub(f"127.0.0.1:{rnd.randrange(30000, 61000)}", access))
                out.append(req.sub(f"cmpl-{rnd.getrandbits(128):032x}", hms.sub(t, finished)))
            if rnd.random() < 0.02:
                out += [hms.sub(t, error), notfound]
            if sec % 10 == 0:
                out.append(figs.sub(f"throughput: {rnd.random() * 1e4:.1f} tokens/s, Avg generation throughput: "
                                    f"{rnd.random() * 1e3:.1f}", hms.sub(t, stats)))
            chunk = "\n".join(out) + "\n"
            f.write(chunk)
            written += len(chunk)


DEMO_SERVER = FIXTURES / "recorded" / "demo_serve_eval.log"


def vllm_server(path: Path, mb: int, seed: int = 2, per_s: int = 40) -> None:
    """A ~mb MB vLLM server log made from the demo's own server log (tests/fixtures/logs/recorded/
    demo_serve_eval.log: the demo pipeline's serve_eval stage, vllm-cpu 0.32.0 with an EAGLE-3
    drafter): its startup up to `Application startup complete.`, then its serving lines, per second
    per_s access lines (POST /v1/completions, GET /metrics) and every 10 s its `Engine 000:` stats
    and `SpecDecoding metrics:` lines, ports, times and figures varied; then its own shutdown lines
    and a worker's logged traceback ending the run (public/vllm_v1_worker_exception.log, with the
    exception line of vllm_multiproc_oom.log). Every line's words are the logs'."""
    rnd = random.Random(seed)
    target = mb * 1024 * 1024
    lines = DEMO_SERVER.read_text(encoding="utf-8").splitlines()
    up = next(i for i, ln in enumerate(lines) if "Application startup complete." in ln)
    down = next(i for i, ln in enumerate(lines) if "[shutdown]" in ln)
    startup, shutdown = lines[: up + 1], lines[down:]
    post = next(ln for ln in lines if '"POST /v1/completions' in ln)
    get = next(ln for ln in lines if '"GET /metrics' in ln)
    stats = next(ln for ln in lines if "Engine 000:" in ln)
    spec = next(ln for ln in lines if "SpecDecoding metrics:" in ln)
    tb = (FIXTURES / "public" / "vllm_v1_worker_exception.log").read_text(encoding="utf-8").splitlines()
    tb += (FIXTURES / "public" / "vllm_multiproc_oom.log").read_text(encoding="utf-8").splitlines()[-1:]
    port = re.compile(r"127\.0\.0\.1:\d+")
    hms = re.compile(r"\d\d:\d\d:\d\d")
    num = re.compile(r"\d+\.\d+")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(startup) + "\n")
        written, sec = 0, 0
        while written < target:
            sec += 1
            t = f"{4 + sec // 3600 % 20:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
            out = [port.sub(f"127.0.0.1:{rnd.randrange(30000, 61000)}", post if rnd.random() < 0.8 else get)
                   for _ in range(per_s)]
            if sec % 10 == 0:
                for ln in (stats, spec):
                    out.append(num.sub(lambda m: f"{rnd.random() * float(m.group()) * 2:.{len(m.group().split('.')[1])}f}",
                                       hms.sub(t, ln)))
            chunk = "\n".join(out) + "\n"
            f.write(chunk)
            written += len(chunk)
        f.write("\n".join(tb + shutdown) + "\n")


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of a command: CPU time is what counts on a machine shared with other work."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


PARSE_CHILD = """
import hashlib, json, os, resource, sys, time
sys.path.insert(0, sys.argv[2])
from eaglelab.host.tail import frames
from eaglelab.host.tail.whole import parse_file
if os.environ.get("BENCH_NO_PREFILTER"):  # the baseline: every line through the recognizers
    frames.MIN_BLOCK = float("inf")
if len(sys.argv) > 3:  # warm-up: pay the one-time costs (lazy imports: eaglelab.eta pulls numpy) first
    parse_file(sys.argv[3])
    # numpy's OpenBLAS starts a thread at import that spins ~0.1 s of CPU before it sleeps: also
    # once per process, and counted by process_time(); let it settle.
    time.sleep(0.5)
t0, c0 = time.perf_counter(), time.process_time()
s = parse_file(sys.argv[1])
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"s": dt, "cpu": cpu, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "lines": s["lines"], "frames": s["frames"], "state": s["state"],
                  "digest": hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()}))
"""


def parse_in_child(path: Path, warmup: Path | None = None, prefilter: bool = True) -> dict:
    """parse_file(path) in a fresh process: its CPU time, peak RSS, a few counts, a digest of the
    whole state. With warmup, a small log is parsed first, so that one-time costs are not counted
    as throughput; prefilter=False feeds every line through the recognizers (the baseline)."""
    argv = [sys.executable, "-c", PARSE_CHILD, str(path), str(ROOT / "py")] + ([str(warmup)] if warmup else [])
    env = dict(os.environ, **({} if prefilter else {"BENCH_NO_PREFILTER": "1"}))
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out)


def throughput(tmp: Path, mb: int, runs_n: int = 5, server_mb: int = 50, only_server: bool = False) -> None:
    print(f"## 1. Throughput (same run, same file, page cache warm; CPU seconds, best of {runs_n})\n")
    print("parse_file in a fresh process after a 1 MB warm-up parse (throughput), and as the first parse of "
          "that process (`cold`: adds the one-time cost of what parse_file imports lazily: numpy via eaglelab.eta, whose OpenBLAS thread spins ~0.1 s of CPU after import, where a bar is still running; the warm-up's own bar is, so the warm process carries numpy even for a log that never needs it)\n")
    print("| log | size | lines | frames read | grep -c | CPU s | MB/s | parse CPU s | MB/s | lines/s | speed vs grep "
          "| cold parse CPU s | cold vs grep |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    warm = tmp / "warmup.log"
    tqdm_heavy(warm, 1, seed=3)
    cases = [("tqdm-heavy", tqdm_heavy, ["it/s", "global_step"], mb), ("line-heavy", line_heavy, ["INFO"], mb),
             ("vLLM server (demo's lines)", vllm_server, ["INFO"], server_mb)]
    if only_server:
        cases = cases[2:]
    for name, gen, patterns, size_mb in cases:
        path = tmp / f"{name.split()[0]}.log"
        gen(path, size_mb)
        size = path.stat().st_size / 1e6
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
        n = runs_n
        runs = [parse_in_child(path, warm) for _ in range(n)]
        cold = min(parse_in_child(path)["cpu"] for _ in range(n))
        p = min(r["cpu"] for r in runs)
        r = runs[0]
        for pat in patterns:
            g = min(timed(["grep", "-c", pat, str(path)])[1] for _ in range(runs_n))
            g = max(g, 1e-3)
            print(f"| {name} | {size:.0f} MB | {r['lines']} | {r['frames']} | `grep -c '{pat}'` | {g:.3f} | "
                  f"{size / g:.0f} | {p:.3f} | {size / p:.0f} | {r['lines'] / p:,.0f} | **{g / p:.3f}** | {cold:.3f} | {g / cold:.3f} |")
        base = parse_in_child(path, warm, prefilter=False)  # once: line by line is slow
        same = "same state" if base["digest"] == r["digest"] else "**STATES DIFFER**"
        print(f"| {name}, line by line (no prefilter; 1 run) | | | | | | | {base['cpu']:.3f} | {size / base['cpu']:.0f} | "
              f"{base['lines'] / base['cpu']:,.0f} | {g / base['cpu']:.3f} | prefilter {base['cpu'] / p:.1f}x faster | {same} |")
        path.unlink()
    print(f"\nload average while measuring: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")


def memory(tmp: Path, sizes: list[int]) -> None:
    print("## 2. Peak RSS of a fresh process parsing a tqdm-heavy log of growing size\n")
    base = subprocess.run([sys.executable, "-c", "import resource,sys; sys.path.insert(0, sys.argv[1]);"
                           "import eaglelab.host.tail.whole; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024)",
                           str(ROOT / "py")], capture_output=True, text=True, check=True).stdout
    print(f"- import only: {float(base):.0f} MB")
    for mb in sizes:
        path = tmp / f"grow-{mb}.log"
        tqdm_heavy(path, mb, seed=mb)
        r = parse_in_child(path)
        print(f"- {mb:4d} MB log: peak RSS {r['rss_mb']:.0f} MB ({r['frames']} frames, {r['lines']} lines, {r['s']:.2f} s)")
        path.unlink()
    print()


FOLLOW_CHILD = """
import sys, threading, signal
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from eaglelab.host.tail import follow_run
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
follow_run(Path(sys.argv[1]), stop)
"""


def latency(tmp: Path, n: int, interval: float, prefill: int = 0) -> None:
    run = tmp / f"run-{prefill}"
    run.mkdir()
    log = open(run / "output.log", "ab", buffering=0)
    for k in range(prefill):  # a long training run so far: the state carries big metric curves
        log.write(b"[20:00:00] INFO     train/loss=%.3f, train/full_acc_0=0.500, train/cond_acc_0=0.400, "
                  b"profile/tokens_per_s=1.20e+04, epoch=0, lr=1.00e-04, global_step=%d\n" % (3.0 / (k + 1), k))
    follower = subprocess.Popen([sys.executable, "-c", FOLLOW_CHILD, str(run), str(ROOT / "py")])
    seen: dict[int, float] = {}
    done = threading.Event()

    def watch() -> None:
        last = None
        while not done.is_set():
            try:
                st = os.stat(run / "state.json")
            except FileNotFoundError:
                time.sleep(0.001)
                continue
            key = (st.st_mtime_ns, st.st_ino)
            if key != last:
                last = key
                now = time.perf_counter()
                try:
                    p = json.loads((run / "state.json").read_bytes()).get("progress") or {}
                except ValueError:
                    continue
                if p.get("n") is not None:
                    seen.setdefault(int(p["n"]), now)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(1.5)  # let the follower start (imports, watchdog)
    written: dict[int, float] = {}
    rnd = random.Random(2)
    for i in range(1, n + 1):
        if i % 10 == 0:  # a few log lines among the frames
            log.write(b"\n[20:00:00] INFO     train/loss=1.000, global_step=%d\n" % i)
        written[i] = time.perf_counter()
        log.write(b"\rTraining:  %3d%%|#         | %d/%d [00:%02d<00:10, 9.00it/s]" % (100 * i // n, i, n, i % 60))
        time.sleep(interval * (0.5 + rnd.random()))
    time.sleep(1.0)
    done.set()
    follower.terminate()
    follower.wait(10)
    lat = sorted(1000 * (seen[i] - written[i]) for i in written if i in seen)
    missed = n - len(lat)
    q = statistics.quantiles(lat, n=100)
    size = (run / "state.json").stat().st_size / 1e3
    print(f"- {n} frames at ~{1 / interval:.0f} Hz, {prefill} metric lines before (state.json {size:.0f} kB): "
          f"p50 {statistics.median(lat):.0f} ms, p95 {q[94]:.0f} ms, max {lat[-1]:.0f} ms; "
          f"{missed} frames superseded before a write (the state showed the newer frame)")


CHATTY_CHILD = """
import os, resource, signal, sys, threading
sys.path.insert(0, sys.argv[2])
from eaglelab.host.tail import frames
if os.environ.get("BENCH_NO_PREFILTER"):  # the baseline: every line through the recognizers
    frames.MIN_BLOCK = float("inf")
from pathlib import Path
from eaglelab.host.tail import follow_run
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
r0 = resource.getrusage(resource.RUSAGE_SELF)
follow_run(Path(sys.argv[1]), stop)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
"""


def chatty(tmp: Path, seconds: float = 5.0) -> None:
    """CPU the tailer costs while a stage writes thousands of separate lines a second (an inotify
    event each), beside the writer itself; with the prefilter and without (the baseline)."""
    print("## 4. Tailer CPU under a chatty log\n")
    for prefilter in (True, False):
        _chatty(tmp / f"chatty-{prefilter}", seconds, prefilter)
    print()


def _chatty(run: Path, seconds: float, prefilter: bool) -> None:
    run.mkdir()
    env = dict(os.environ, **({} if prefilter else {"BENCH_NO_PREFILTER": "1"}))
    f = subprocess.Popen([sys.executable, "-c", CHATTY_CHILD, str(run), str(ROOT / "py")], stdout=subprocess.PIPE,
                         text=True, env=env)
    time.sleep(1.5)
    log = open(run / "output.log", "ab", buffering=0)
    t0, n = time.time(), 0
    while time.time() - t0 < seconds:
        for _ in range(50):
            log.write(b"INFO 11-29 20:00:00 [x.py:1] request %d done\n" % n)
            n += 1
        time.sleep(0.01)
    time.sleep(1.0)
    f.terminate()
    cpu = float(f.communicate()[0])
    print(f"- {'with the prefilter' if prefilter else 'line by line (no prefilter)'}: {n / seconds:.0f} lines/s, "
          f"one write each, for {seconds:.0f} s: the tailer used {cpu:.2f} CPU s ({100 * cpu / (seconds + 1):.0f}% of one core)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300, help="size of the throughput logs")
    ap.add_argument("--server-mb", type=int, default=50, help="size of the vLLM server log (the demo's lines)")
    ap.add_argument("--server-only", action="store_true", help="throughput: only the vLLM server log")
    ap.add_argument("--sizes", default="25,100,400", help="log sizes (MB) for the memory check")
    ap.add_argument("--runs", type=int, default=5, help="throughput: best of this many runs")
    ap.add_argument("--latency-n", type=int, default=200)
    ap.add_argument("--latency-interval", type=float, default=0.05)
    ap.add_argument("--only", choices=("throughput", "memory", "latency", "chatty"), default=None)
    a = ap.parse_args()
    print(f"# bench_parse  ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})\n")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if a.only in (None, "throughput"):
            throughput(tmp, a.mb, a.runs, a.server_mb, a.server_only)
        if a.only in (None, "memory"):
            memory(tmp, [int(x) for x in a.sizes.split(",")])
        if a.only in (None, "latency"):
            print("## 3. Latency: frame written -> state.json updated (follow_run in its own process, as under jobwrap)\n")
            for prefill in (0, 20000):
                latency(tmp, a.latency_n, a.latency_interval, prefill)
            print()
        if a.only in (None, "chatty"):
            chatty(tmp)


if __name__ == "__main__":
    main()
