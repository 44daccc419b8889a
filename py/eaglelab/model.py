"""The shapes the parts of eaglelab exchange, typed once (pydantic), and the one rule for how a
run ended.

Host side and controller side both import this module (it is pure: no I/O). Each boundary
validates what crosses it — a run directory's meta.json and exit.json (hostside), a host's report
(the ssh executor), a registry row, the state JSON — with `validate_*` below, so a file of the
wrong shape is named and skipped where it is read instead of crashing a reader far away.
docs/interfaces.md lists these fields; tests/test_model.py checks that the two agree.

Every model allows fields it does not declare (`extra="allow"`): the contracts add fields, never
change one (docs/interfaces.md), and an older controller must read a newer host's answer.
"""

from __future__ import annotations

import signal as _signal
from enum import StrEnum
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class RunState(StrEnum):
    """A run's state. Strings on the wire and in SQLite; compares equal to its value."""

    PENDING = "pending"      # launched, jobwrap not started yet (or queued on a Slurm host)
    RUNNING = "running"
    COMPLETED = "completed"  # exit 0
    FAILED = "failed"        # any end nobody asked for: exit != 0, SIGKILL, a crash signal
    KILLED = "killed"        # stopped on purpose (`lab stop`, TERM/INT), or the wrapper vanished (lost)

    @property
    def active(self) -> bool:
        return self in ACTIVE


ACTIVE = frozenset({RunState.PENDING, RunState.RUNNING})
FINAL = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.KILLED})


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Failure(_Open):
    """Why a run failed: the parser's diagnosis (reason from a fixed list) or the exit status's."""

    reason: str = "other"
    message: str | None = None
    line: int | None = None
    process: str | None = None


class Meta(_Open):
    """meta.json: written at launch, completed by jobwrap when the stage has started."""

    schema_: int = Field(1, alias="schema")
    run_id: str
    stage: str
    host: str | None = None
    profile: str | None = None
    fingerprint: str | None = None
    command: list[str] = []
    cwd: str | None = None
    kind: str = "job"
    launched_at: str | None = None
    started_at: str | None = None
    jobwrap_pid: int | None = None
    pid: int | None = None
    pgid: int | None = None


class Exit(_Open):
    """exit.json: jobwrap's record of how the stage's process ended."""

    schema_: int = Field(1, alias="schema")
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    ended_at: str | None = None
    duration_s: float | None = None
    state: RunState | None = None
    stop_requested: bool = False
    orphans: bool = False
    error: str | None = None


class RunRecord(_Open):
    """One run as the controller knows it: hostside.read_run's answer, a registry row, a run of
    `lab status --json`. `log_state` is the state JSON (docs/interfaces.md), combined with the exit."""

    id: str
    stage: str
    host: str
    state: RunState
    profile: str | None = None
    fingerprint: str | None = None
    kind: str = "job"
    run_dir: str | None = None
    pid: int | None = None
    pgid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    duration_s: float | None = None
    lost: bool = False      # the wrapper vanished and nothing of the stage lives: its end is unknown
    orphaned: bool = False  # the wrapper vanished but the stage lives on (running, unsupervised)
    orphans: bool = False   # processes of the stage's group outlived its end
    log_state: dict[str, Any] | None = None
    log_size: int | None = None
    slurm: dict[str, Any] | None = None


class HostReport(_Open):
    """hostside.report's answer: every run on the host, and the machine's figures."""

    schema_: int = Field(1, alias="schema")
    runs: list[Any] = []  # each checked on its own (validate_run): one bad run never hides the rest
    gpus: list[dict[str, Any]] | None = None
    checked_at: str | None = None
    free_disk_bytes: int | None = None
    load: list[float] | None = None


# The run record's fields, in one place: the registry's columns and `lab status --json` use them.
RUN_FIELDS: tuple[str, ...] = tuple(RunRecord.model_fields)


class BadRecord(ValueError):
    """A file or an answer of the wrong shape; the message says which and what is wrong."""


def _validate(model: type[BaseModel], data: Any, where: str) -> BaseModel:
    if not isinstance(data, dict):
        raise BadRecord(f"{where}: expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        bits = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(top)'}: {err['msg']}" for err in e.errors()[:3])
        raise BadRecord(f"{where}: {bits}") from None


def validate_meta(data: Any, where: str) -> Meta:
    return _validate(Meta, data, where)


def validate_exit(data: Any, where: str) -> Exit:
    return _validate(Exit, data, where)


def validate_run(data: Any, where: str) -> dict:
    """A run record checked and normalized (types as declared), as a plain JSON-able dict."""
    return _validate(RunRecord, data, where).model_dump(mode="json", by_alias=True)


def validate_report(data: Any, where: str) -> HostReport:
    return _validate(HostReport, data, where)


# -- how a run ended: the one rule --------------------------------------------------------------

class Ending(NamedTuple):
    state: RunState
    failure: dict | None  # Failure as a dict, None unless FAILED


def decide_end(exit_code: int | None, signal: int | None, *, stop_requested: bool = False,
               named: dict | None = None, last_line: str | None = None,
               signal_name: str | None = None) -> Ending:
    """How a run ended, from its exit status and what its log said (`named`: the parser's failure).

    Exit 0 is completed. A stop somebody asked for (`lab stop`, TERM/INT, exit 130) is killed.
    Any other end is failed, with the reason the log named, else the one the exit status suggests:
    SIGKILL or 137 → host_oom_killed (the kernel's OOM killer is the usual sender), 124 → timeout,
    else `other` with the log's last line. jobwrap (exit.json), the parser (state JSON), the
    registry and the notifications all use this function, so a run never ends two ways.
    """
    if exit_code == 0 and signal is None:
        return Ending(RunState.COMPLETED, None)
    if stop_requested or signal in (_signal.SIGTERM, _signal.SIGINT) or exit_code == 130:
        return Ending(RunState.KILLED, None)
    if named:
        return Ending(RunState.FAILED, dict(named))
    if signal == _signal.SIGKILL or exit_code == 137:
        return Ending(RunState.FAILED, {"reason": "host_oom_killed", "line": None, "process": None,
                                        "message": "killed by SIGKILL with no reason in the log (the kernel's OOM "
                                                   "killer is the usual sender; see `dmesg`)"})
    if exit_code == 124:
        return Ending(RunState.FAILED, {"reason": "timeout", "line": None, "process": None,
                                        "message": "exit code 124 (timeout)"})
    what = f"signal {signal} ({signal_name or signal_text(signal)})" if signal is not None else f"exit code {exit_code}"
    return Ending(RunState.FAILED, {"reason": "other", "line": None, "process": None,
                                    "message": f"ended by {what}; last line: {last_line}" if last_line
                                    else f"ended by {what}; the log is empty"})


def signal_text(sig: int | None) -> str | None:
    """SIGKILL for 9; None for None; SIG<n> for a number no signal has."""
    if sig is None:
        return None
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"


def exit_text(run: dict) -> str:
    """The exit status in words ("signal 9", "exit code 3", a lost wrapper); "" for exit 0 or none."""
    if run.get("signal"):
        return f"signal {run['signal']}"
    if run.get("exit_code") not in (None, 0):
        return f"exit code {run['exit_code']}"
    if run.get("lost"):
        return "jobwrap vanished: host rebooted or wrapper killed"
    if run.get("orphaned"):
        return "orphaned: jobwrap was killed, the stage runs on unsupervised (lab stop stops it)"
    return ""


def how_it_ended(run: dict) -> str | None:
    """Why a run ended as it did, for people: the parser's diagnosis when there is one, else the
    exit status in words; None when there is nothing to say."""
    ls = run.get("log_state")
    failure = ls.get("failure") if isinstance(ls, dict) else None
    if isinstance(failure, dict):
        msg = (failure.get("message") or "").strip()
        return f"{failure.get('reason', 'other')}: {msg}" if msg else str(failure.get("reason"))
    return exit_text(run) or None
