"""Parser and tailer benchmarks: throughput against grep, memory as the log grows, live latency.

    .venv/bin/python bench/bench_parse.py [--mb 300] [--latency-n 200]

Prints figures (no pass/fail):
1. Throughput of `lab parse`'s core (eaglelab.host.tail.whole.parse_file) on a generated tqdm-heavy
   log (mostly \\r frames of several bars, some log and metric lines), and on a line-heavy log
   (no frames), each beside `grep -c` over the same file in the same run, as a ratio.
2. Peak RSS of a fresh process parsing logs of growing size: flat means constant memory.
3. Latency from a frame written to output.log to state.json showing it, with follow_run running
   in another process (as under jobwrap): p50 / p95 / max over --latency-n updates.
"""

from __future__ import annotations

import argparse
import json
import os
import random
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


def line_heavy(path: Path, mb: int, seed: int = 1) -> None:
    """A vLLM server log: one record per line, no frames."""
    rnd = random.Random(seed)
    target = mb * 1024 * 1024
    lines = [
        '(APIServer pid=1) INFO:     127.0.0.1:{p} - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "(APIServer pid=1) INFO 11-29 20:{m:02d}:{s:02d} [loggers.py:271] Engine 000: Avg prompt throughput: {a:.1f} tokens/s, "
        "Avg generation throughput: {b:.1f} tokens/s, Running: 18 reqs, Waiting: 4 reqs, GPU KV cache usage: 57.9%, Prefix cache hit rate: 40.5%",
        "(EngineCore_DP0 pid=2) INFO 11-29 20:{m:02d}:{s:02d} [core.py:12] Finished request chatcmpl-{p}.",
        "(APIServer pid=1) WARNING 11-29 20:{m:02d}:{s:02d} [protocol.py:112] The following fields were present in the request but ignored: {{'strict'}}",
    ]
    with open(path, "w") as f:
        written = 0
        k = 0
        while written < target:
            out = []
            for _ in range(5000):
                k += 1  # a server writes a few hundred lines per second: the time moves on slowly
                out.append(rnd.choice(lines).format(p=rnd.randrange(10**6), m=k // 30000 % 60, s=k // 500 % 60,
                                                    a=rnd.random() * 1e4, b=rnd.random() * 1e3))
            chunk = "\n".join(out) + "\n"
            f.write(chunk)
            written += len(chunk)


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of a command: CPU time is what counts on a machine shared with other work."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


PARSE_CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from eaglelab.host.tail.whole import parse_file
if len(sys.argv) > 3:  # warm-up: pay the one-time costs (lazy imports: eaglelab.eta pulls numpy) first
    parse_file(sys.argv[3])
    # numpy's OpenBLAS starts a thread at import that spins ~0.1 s of CPU before it sleeps: also
    # once per process, and counted by process_time(); let it settle.
    time.sleep(0.5)
t0, c0 = time.perf_counter(), time.process_time()
s = parse_file(sys.argv[1])
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"s": dt, "cpu": cpu, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "lines": s["lines"], "frames": s["frames"], "state": s["state"]}))
"""


def parse_in_child(path: Path, warmup: Path | None = None) -> dict:
    """parse_file(path) in a fresh process: its CPU time, peak RSS, a few counts. With warmup, a
    small log is parsed first, so that one-time costs are not counted as throughput."""
    argv = [sys.executable, "-c", PARSE_CHILD, str(path), str(ROOT / "py")] + ([str(warmup)] if warmup else [])
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def throughput(tmp: Path, mb: int, runs_n: int = 5) -> None:
    print(f"## 1. Throughput (same run, same file, page cache warm; CPU seconds, best of {runs_n})\n")
    print("parse_file in a fresh process after a 1 MB warm-up parse (throughput), and as the first parse of "
          "that process (`cold`: adds the one-time cost of what parse_file imports lazily: numpy via eaglelab.eta, whose OpenBLAS thread spins ~0.1 s of CPU after import)\n")
    print("| log | size | lines | frames read | grep -c | CPU s | MB/s | parse CPU s | MB/s | speed vs grep "
          "| cold parse CPU s | cold vs grep |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    warm = tmp / "warmup.log"
    tqdm_heavy(warm, 1, seed=3)
    cases = (("tqdm-heavy", tqdm_heavy, ["it/s", "global_step"]), ("line-heavy", line_heavy, ["INFO"]))
    for name, gen, patterns in cases:
        path = tmp / f"{name}.log"
        gen(path, mb)
        size = path.stat().st_size / 1e6
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the cache
        n = runs_n if name == "tqdm-heavy" else 1  # line-heavy: 20 s a parse, and far from grep anyway
        runs = [parse_in_child(path, warm) for _ in range(n)]
        cold = min(parse_in_child(path)["cpu"] for _ in range(n))
        p = min(r["cpu"] for r in runs)
        r = runs[0]
        for pat in patterns:
            g = min(timed(["grep", "-c", pat, str(path)])[1] for _ in range(runs_n))
            g = max(g, 1e-3)
            print(f"| {name} | {size:.0f} MB | {r['lines']} | {r['frames']} | `grep -c '{pat}'` | {g:.3f} | "
                  f"{size / g:.0f} | {p:.3f} | {size / p:.0f} | **{g / p:.2f}** | {cold:.3f} | {g / cold:.2f} |")
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
import resource, signal, sys, threading
sys.path.insert(0, sys.argv[2])
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
    event each), beside the writer itself."""
    print("## 4. Tailer CPU under a chatty log\n")
    run = tmp / "chatty"
    run.mkdir()
    f = subprocess.Popen([sys.executable, "-c", CHATTY_CHILD, str(run), str(ROOT / "py")], stdout=subprocess.PIPE, text=True)
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
    print(f"- {n / seconds:.0f} lines/s, one write each, for {seconds:.0f} s: the tailer used {cpu:.2f} CPU s "
          f"({100 * cpu / (seconds + 1):.0f}% of one core)\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300, help="size of the throughput logs")
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
            throughput(tmp, a.mb, a.runs)
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
