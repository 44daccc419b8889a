"""The serving smoke: `serve --mode eval --smoke-checkpoints DIR`, the job `smoke-serve_eval` beside train.

While training runs, it loads the latest whole epoch checkpoint `DIR/<n>/` in vLLM exactly as the
`serve_eval` service will load the final drafter (the same argv: a flag vLLM rejects, or a drafter
config it cannot read, fails here, hours early), waits for /health (fails at once when vLLM exits,
with its last lines), sends a few short greedy chat completions and reads vLLM's spec_decode counters
from /metrics before and after: one metric line for the log parser,

    served/acceptance_rate=0.1830, served/mean_acceptance_length=1.5490, served/drafts=48, served/epoch=0, epoch=0

then stops vLLM (TERM to its process group, then KILL) and exits 0. Every failure exits non-zero
naming the checkpoint and the cause.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from ..errors import StageError
from . import eval as eval_stage
from . import spec_metrics
from .common import completed_epochs

POLL_S = 2.0
TAIL = 20  # vLLM's last lines kept for an error
STOP_GRACE_S = 30.0
DEFAULT_MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]


def whole_safetensors(path: Path) -> bool:
    """Whether a .safetensors file is complete: its header parses and the data it declares is there."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return False
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return False
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    return size >= 8 + n + max(ends, default=0)


def latest_checkpoint(ckpts: Path) -> Path | None:
    """The newest whole epoch checkpoint under the train stage's out dir, or None."""
    for n in reversed(completed_epochs(ckpts)):
        if whole_safetensors(ckpts / str(n) / "model.safetensors"):
            return ckpts / str(n)
    return None


def wait_for_checkpoint(ckpts: Path, wait_s: float, say, clock=time.monotonic, sleep=time.sleep) -> Path:
    deadline, told = clock() + wait_s, False
    while True:
        found = latest_checkpoint(ckpts)
        if found is not None:
            return found
        if clock() >= deadline:
            raise StageError(f"{ckpts}: no whole epoch checkpoint (<n>/config.json + model.safetensors) after "
                             f"{wait_s:.0f} s: training has not finished its first epoch (or writes elsewhere: "
                             "--smoke-checkpoints is the train stage's --out); raise --smoke-wait-s")
        if not told:
            say(f"serve smoke: waiting up to {wait_s:.0f} s for the first epoch checkpoint in {ckpts}")
            told = True
        sleep(POLL_S)


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def metric_line(stats: dict, epoch: int) -> str:
    """The one line the log parser reads as the served figures (pure)."""
    pos = "".join(f", served/pos_{i}={p:.4f}" for i, p in enumerate(stats["per_position_acceptance"]))
    return (f"served/acceptance_rate={stats['acceptance_rate']:.4f}, "
            f"served/mean_acceptance_length={stats['mean_acceptance_length']:.4f}, served/drafts={stats['drafts']}"
            f"{pos}, served/epoch={epoch}, epoch={epoch}")


class Server:
    """vLLM in a process group of its own; its output goes on to ours, its last lines are kept."""

    def __init__(self, argv: list[str], env: dict):
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL)
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        out = sys.stdout.buffer
        for raw in self.proc.stdout:
            out.write(raw)
            out.flush()
            text = raw.decode("utf-8", "replace").rstrip("\n").rsplit("\r", 1)[-1].strip()
            if text:
                self.tail.append(text)

    def last_lines(self) -> str:
        self.reader.join(5)
        return "\n".join(self.tail)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """TERM to the group, wait, KILL what is left; returns once no process of the group is left."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            if self._gone_within(wait_s):
                break
        self.proc.wait()
        self.reader.join(5)

    def _gone_within(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            self.proc.poll()  # reaps vLLM itself: a zombie still counts as a member of the group
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.2)
        return False


def wait_healthy(server: Server, endpoint: str, ready_s: float) -> float:
    """Seconds until GET /health answers 200; StageError when vLLM exits first or takes too long."""
    t0 = time.monotonic()
    while True:
        code = server.proc.poll()
        if code is not None:
            last = server.last_lines()
            first = last.splitlines()[-1] if last else "(no output)"
            raise StageError(f"vLLM exited with code {code} before {endpoint}/health answered: {first}\n"
                             f"vLLM's last lines:\n{last}")
        try:
            if requests.get(f"{endpoint}/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except requests.RequestException:
            pass
        if time.monotonic() - t0 > ready_s:
            raise StageError(f"vLLM did not answer {endpoint}/health within {ready_s:.0f} s (--smoke-ready-s); "
                             f"its last lines:\n{server.last_lines()}")
        time.sleep(1.0)


def read_counters(endpoint: str) -> dict:
    try:
        r = requests.get(f"{endpoint}/metrics", timeout=10)
        r.raise_for_status()
    except requests.RequestException as e:
        raise StageError(f"{endpoint}/metrics: {e}") from None
    return spec_metrics.parse_spec_metrics(r.text)


def chat(endpoint: str, model: str, messages: list, max_tokens: int) -> int:
    """One greedy chat completion of exactly max_tokens tokens; the tokens generated."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True}
    try:
        r = requests.post(f"{endpoint}/v1/chat/completions", json=body, timeout=600)
    except requests.RequestException as e:
        raise StageError(f"{endpoint}/v1/chat/completions: {e}") from None
    if r.status_code != 200:
        raise StageError(f"{endpoint}/v1/chat/completions answered {r.status_code}: {r.text[:400]}")
    return int(((r.json().get("usage") or {}).get("completion_tokens")) or 0)


def measure(endpoint: str, model: str, prompts: list[list], max_tokens: int) -> dict:
    """The prompts through the server; spec_decode figures of those requests (warm-up excluded)."""
    chat(endpoint, model, prompts[0], 4)  # the first request compiles and warms: not counted
    before = read_counters(endpoint)
    tokens = sum(chat(endpoint, model, m, max_tokens) for m in prompts)
    for _ in range(5):  # the counters follow the responses by a step at most
        stats = spec_metrics.spec_stats(before, read_counters(endpoint))
        if stats["drafts"]:
            break
        time.sleep(0.5)
    stats["completion_tokens"] = tokens
    return stats


def prompt_messages(path: Path | None, n: int) -> list[list]:
    if path is None:
        rows = [{"messages": DEFAULT_MESSAGES}]
    else:
        rows = eval_stage.load_prompts(path, n)
    return [rows[i % len(rows)]["messages"] for i in range(n)]


def run(argv: list[str], env: dict, ckpt: Path, host: str, port: int, served_model: str, prompts: Path | None,
        n_requests: int, max_tokens: int, ready_s: float, say) -> dict:
    """Serve `ckpt`, measure, stop. The figures; StageError naming the checkpoint on any failure."""
    epoch = int(ckpt.name)
    where = f"serve smoke of checkpoint {ckpt}"
    messages = prompt_messages(prompts, n_requests)
    if not port_free(host, port):
        raise StageError(f"{where}: {host}:{port} is in use (another server?); the smoke needs a port of its own "
                         "(pipeline var port_smoke)")
    endpoint = f"http://{host}:{port}"
    previous = {s: signal.signal(s, _exit_on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    t0 = time.monotonic()
    server = Server(argv, env)
    say(f"serve smoke: vLLM pid {server.proc.pid} (its own process group) serving {ckpt} on {endpoint}")
    try:
        ready = wait_healthy(server, endpoint, ready_s)
        say(f"serve smoke: vLLM answered {endpoint}/health after {ready:.0f} s")
        t1 = time.monotonic()
        stats = measure(endpoint, served_model, messages, max_tokens)
        took = time.monotonic() - t1
    except StageError as e:
        raise StageError(f"{where}: {e.message}") from None
    finally:
        server.stop()
        for s, h in previous.items():
            signal.signal(s, h)
    if not stats["drafts"]:
        raise StageError(f"{where}: {endpoint}/metrics counted no spec_decode drafts over {n_requests} request(s): "
                         "vLLM served without speculation; the eval would fail the same way")
    pos = ", ".join(f"{p:.2f}" for p in stats["per_position_acceptance"])
    say(f"serve smoke: epoch {epoch}: {n_requests} request(s) x {max_tokens} tokens in {took:.1f} s: "
        f"{stats['drafts']} drafts, acceptance {stats['acceptance_rate']:.1%}, mean length "
        f"{stats['mean_acceptance_length']:.2f}, per position [{pos}]; vLLM ready in {ready:.0f} s, stopped; "
        f"{time.monotonic() - t0:.0f} s in all")
    print(metric_line(stats, epoch), flush=True)
    return {**stats, "epoch": epoch, "ready_s": ready, "measure_s": took}


def _exit_on_signal(signum, frame):  # `lab stop` of the smoke: stop vLLM (the finally above) and go
    raise SystemExit(128 + signum)
