"""eaglelab's own stages say where they are with one-line markers, formatted and read here.

    eaglelab: phase extract started
    eaglelab: phase extract completed
    eaglelab: metric vocab/coverage=0.983 step=0
    eaglelab: ready
    eaglelab: done
    eaglelab: failed disk_full: 12.0 GB free on /data, 828 GB needed

A stage calls the formatting helpers (or prints the same text); the parser turns the lines into
phases, metrics, readiness, the end marker and a failure with a reason from the fixed vocabulary.
"""

from __future__ import annotations

import re
import sys

from .events import END, FAILURE, READY, Event, metric, num, phase_end, phase_start

TAG = "eaglelab: "
REASONS = ("cuda_oom", "cuda_assert", "cuda_error", "host_oom_killed", "nccl_error", "disk_full", "import_error",
           "timeout", "time_limit", "segfault", "signal", "killed", "lost", "python_exception", "other")

_PHASE_RE = re.compile(r"phase (?P<name>[\w.-]+) (?P<what>started|completed)(?: (?P<detail>.*))?$")
_METRIC_RE = re.compile(r"metric (?P<name>[\w./-]+)=(?P<v>\S+)(?: step=(?P<step>\S+))?")
_FAILED_RE = re.compile(r"failed (?P<reason>\w+)(?::\s*(?P<msg>.*))?$")


def phase_started(name: str, detail: str = "") -> str:
    return f"{TAG}phase {name} started" + (f" {detail}" if detail else "")


def phase_completed(name: str) -> str:
    return f"{TAG}phase {name} completed"


def metric_line(name: str, value: float, step: float | None = None) -> str:
    return f"{TAG}metric {name}={value:g}" + (f" step={step:g}" if step is not None else "")


def ready_line() -> str:
    return f"{TAG}ready"


def done_line() -> str:
    return f"{TAG}done"


def failed_line(reason: str, message: str) -> str:
    if reason not in REASONS:
        raise ValueError(f"failure reason {reason!r} is not one of {', '.join(REASONS)}")
    return f"{TAG}failed {reason}: {message}"


def emit(line: str) -> None:
    """Print a marker on its own line, flushed, so the tailer sees it at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def recognize(msg: str) -> list[Event]:
    if not msg.startswith(TAG):
        return []
    body = msg[len(TAG):].strip()
    m = _PHASE_RE.match(body)
    if m:
        name = m.group("name")
        return [phase_start(name, m.group("detail") or "")] if m.group("what") == "started" else [phase_end(name)]
    m = _METRIC_RE.match(body)
    if m and num(m.group("v")) is not None:
        return [metric(m.group("name"), num(m.group("v")), num(m.group("step")) if m.group("step") else None)]
    if body == "ready":
        return [Event(READY)]
    if body == "done":
        return [Event(END, "done", message=msg.strip())]
    m = _FAILED_RE.match(body)
    if m:
        reason = m.group("reason") if m.group("reason") in REASONS else "other"
        return [Event(FAILURE, reason, message=msg.strip())]
    return []
