"""What recognizers tell the state machine: small typed events, no I/O, no state."""

from __future__ import annotations

from dataclasses import dataclass

# Event kinds:
PHASE_START = "phase_start"   # name [, detail]
PHASE_END = "phase_end"       # name [, value = duration_s the log itself printed]
READY = "ready"               # a service is ready (vLLM `Application startup complete`)
END = "end"                   # an explicit end marker; name 'done' (job finished) or 'shutdown' (service stopped)
METRIC = "metric"             # name, value, step (None: the next index of that metric)
STALL_HINT = "stall_hint"     # value True/False: the log itself says work is stuck (vLLM running reqs, 0 tok/s)
FAILURE = "failure"           # name = reason, message
TRAIN_STEP = "train_step"     # value = optimizer steps done, step = the epoch (0-based) or None
TRAIN_PLAN = "train_plan"     # name in epochs | steps_per_epoch | max_steps | total_steps, value


@dataclass(slots=True)
class Event:
    kind: str
    name: str = ""
    value: float | bool | None = None
    step: float | None = None
    message: str = ""
    detail: str = ""


def metric(name: str, value: float, step: float | None = None) -> Event:
    return Event(METRIC, name, value, step)


def phase_start(name: str, detail: str = "") -> Event:
    return Event(PHASE_START, name, detail=detail)


def phase_end(name: str, duration_s: float | None = None) -> Event:
    return Event(PHASE_END, name, duration_s)


def num(text: str) -> float | None:
    """A number as a log prints it (`1.2e-05`, `57.9`, `1,024`), or None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None
