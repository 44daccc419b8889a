"""The shapes the parts of eaglelab exchange, typed once, and the one rule for how a run ended.

Host side and controller side both import this module, so it is standard library only: a host
whose venv was made from a small lock (or an old one) must still answer (tests/test_host_imports).
The shapes are TypedDicts — static types for readers and checkers — and `check` validates a value
against one at run time. Each boundary checks what crosses it: a run directory's meta.json and
exit.json (hostside), a host's report and each of its runs (the controller, `checked_report`), so
a file of the wrong shape is named and skipped where it is read, never a crash far away.
docs/interfaces.md lists these fields; tests/test_model.py checks that the two agree.

Every shape allows keys it does not declare: the contracts add fields, never change one
(docs/interfaces.md), and an older controller must read a newer host's answer.
"""


import dataclasses
import functools
import signal as _signal
import types
from dataclasses import dataclass, field, fields
from enum import Enum, StrEnum
from typing import Any, NamedTuple, Required, TypedDict, Union, get_args, get_origin, get_type_hints


class RunState(StrEnum):
    """A run's state. Strings on the wire and in SQLite; compares equal to its value."""

    PENDING = "pending"      # launched, jobwrap not started yet (or queued on a Slurm host)
    RUNNING = "running"      # also while orphaned: the wrapper died, the stage lives on
    COMPLETED = "completed"  # exit 0
    FAILED = "failed"        # any end nobody asked for: exit != 0, SIGKILL, a crash signal
    KILLED = "killed"        # stopped on purpose (`lab stop`, TERM/INT), or the wrapper vanished (lost)

    @property
    def active(self) -> bool:
        return self in ACTIVE


class StageState(StrEnum):
    """What a stage shows (`lab status`, the page, /metrics): its latest run's state, or one the
    status adds — stalled (its log stopped moving), unreachable (its host does not answer), gated
    (a gate kept it from running), smoke_failed (its smoke test failed before it ran)."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    KILLED = "killed"
    STALLED = "stalled"
    UNREACHABLE = "unreachable"
    GATED = "gated"
    SMOKE_FAILED = "smoke_failed"


ACTIVE = frozenset({RunState.PENDING, RunState.RUNNING})
FINAL = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.KILLED})


class Meta(TypedDict, total=False):
    """meta.json: written at launch, completed by jobwrap when the stage has started."""

    schema: int
    run_id: Required[str]
    stage: Required[str]
    host: str | None
    profile: str | None
    fingerprint: str | None
    command: list[str]
    cwd: str | None
    kind: str
    outputs: list[str]   # the stage's outputs (rendered; relative to cwd): their manifests can prove its end
    env_keys: list[str]  # the stage's env names; their values travel in env.json (0600), not here
    launched_at: str | None
    started_at: str | None
    jobwrap_pid: int | None
    pid: int | None
    pgid: int | None
    attempt: int          # which start of this run directory (1; more when Slurm requeued the job)
    attempts: list[dict[str, Any]]  # the earlier starts: {attempt, started_at, jobwrap_pid, pid, ended, ended_at}
    refused_starts: list[dict[str, Any]]  # starts refused by `requeue: refuse`: {at, job_id, restart_count, message}


class Exit(TypedDict, total=False):
    """exit.json: jobwrap's record of how the stage's process ended."""

    schema: int
    exit_code: int | None
    signal: int | None
    signal_name: str | None
    ended_at: str | None
    duration_s: float | None
    state: RunState | None
    stop_requested: bool
    orphans: bool
    error: str | None
    failure: dict[str, Any] | None  # what jobwrap itself saw (disk_full), when the log could not say it
    outputs_done: str | None  # written in the lost wrapper's place: the outputs' manifests of this run
    recorded_by: str | None   # who wrote it when jobwrap could not (`lab stop`, a report)
    attempt: int | None       # the start of the run directory this end belongs to (meta.json's)
    stopped: dict[str, Any] | None  # paused (SIGSTOP): {total_s, intervals: [[from, to]]}; no work then


@dataclass(frozen=True)
class Run:
    """One run as the controller knows it: hostside.read_run's answer, a registry row, a run of
    `lab status --json`. THE field list of a run: RUN_FIELDS, the registry's columns and the
    check at the controller's boundary are derived from it. `log_state` is the state JSON
    (docs/interfaces.md), combined with the exit; keys a record carries beyond these travel in
    `extra` (a newer host's, or a report's own: heartbeat_at, command ...), so nothing is lost."""

    id: str
    stage: str
    host: str
    state: RunState
    profile: str | None = None
    fingerprint: str | None = None
    kind: str | None = None
    run_dir: str | None = None
    pid: int | None = None
    pgid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    duration_s: float | None = None
    lost: bool = False       # the wrapper vanished and nothing of the stage lives: its end is unknown
    orphaned: bool = False   # the wrapper vanished but the stage lives on (running, unsupervised)
    orphans: bool = False    # processes of the stage's group outlived its end
    end_unknown: str | None = None  # exit.json there but unreadable: ended, how unknown (never rerun unasked)
    stop_requested: bool = False    # `lab stop` asked for its end ("(stop requested)" beside it)
    attempts: int | None = None     # starts of its run directory (refused ones too): 2+ = Slurm ran it again
    refused_start: str | None = None  # why the latest start was refused (`requeue: refuse`), if one was
    stopped: dict[str, Any] | None = None  # exit.json's: the time its process spent stopped (not work)
    log_state: dict[str, Any] | None = None
    log_size: int | None = None
    slurm: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: dict) -> "Run":
        """A run from its JSON object (checked first: `check(Run, data, where)` names what is wrong)."""
        known = {k: data[k] for k in RUN_FIELDS if k in data}
        known["state"] = RunState(known["state"])
        return cls(**known, extra={k: v for k, v in data.items() if k not in _RUN_FIELD_SET})

    def to_json(self) -> dict:
        """The JSON object: every field, then the extra keys (never overriding a field)."""
        return {**{k: getattr(self, k) for k in RUN_FIELDS},
                **{k: v for k, v in self.extra.items() if k not in _RUN_FIELD_SET}}


RunRecord = Run  # the name the boundary checks used (check(RunRecord, ...)): the same one shape


class HostReport(TypedDict, total=False):
    """hostside.report's answer: every run on the host, and the machine's figures."""

    schema: int
    runs: Required[list[Any]]  # each checked on its own (RunRecord): one bad run never hides the rest
    bad_runs: list[dict[str, Any]]
    gpus: list[dict[str, Any]] | None
    checked_at: str | None
    free_disk_bytes: int | None
    load: list[float] | None
    runs_dir: str | None  # the folder of run directories read (a live run the report lacks is missing)
    host_seq: str | None  # BOOT_ID:MONOTONIC_NS before anything was read: the host's order (registry.supersedes)


# The run record's fields, in one place (Run): the registry's columns and `lab status --json` use them.
RUN_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Run) if f.name != "extra")
_RUN_FIELD_SET = frozenset(RUN_FIELDS)


class BadRecord(ValueError):
    """A file or an answer of the wrong shape; the message says which and what is wrong."""


@functools.cache
def _parts(tp: Any) -> tuple[Any, tuple]:
    return get_origin(tp), get_args(tp)


def _conforms(value: Any, tp: Any) -> bool:
    if tp is Any:
        return True
    origin, args = _parts(tp)
    if origin in (Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if tp is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and (not args or all(_conforms(v, args[0]) for v in value))
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return isinstance(value, str) and value in tp._value2member_map_
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


@functools.cache
def _hints(shape: type) -> dict[str, Any]:
    hints = get_type_hints(shape)  # resolved once per shape: a host's report checks ~50 records
    return {k: v for k, v in hints.items() if k != "extra"} if dataclasses.is_dataclass(shape) else hints


@functools.cache
def _required(shape: type) -> tuple[str, ...]:
    if dataclasses.is_dataclass(shape):  # a field without a default must be there
        return tuple(f.name for f in fields(shape)
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    return tuple(shape.__required_keys__)


def check(shape: type, data: Any, where: str) -> dict:
    """data if it is a JSON object of that shape (required keys present, declared keys of the
    declared types; other keys allowed), else BadRecord naming `where`, the key and what is wrong."""
    if not isinstance(data, dict):
        raise BadRecord(f"{where}: expected a JSON object ({shape.__name__}), got {type(data).__name__}")
    missing = [k for k in _required(shape) if k not in data]
    if missing:
        raise BadRecord(f"{where}: missing {', '.join(missing)} ({shape.__name__})")
    for key, tp in _hints(shape).items():
        if key in data and not _conforms(data[key], tp):
            raise BadRecord(f"{where}: {key} is {data[key]!r:.80}, expected {_type_name(tp)} ({shape.__name__})")
    return data


# -- how a run ended: the one rule --------------------------------------------------------------

class Ending(NamedTuple):
    state: RunState
    failure: dict | None  # {reason, message, line, process}; None unless FAILED


def decide_end(exit_code: int | None, signal: int | None, *, stop_requested: bool = False,
               named: dict | None = None, last_line: str | None = None,
               signal_name: str | None = None, outputs_done: bool = False) -> Ending:
    """How a run ended, from its exit status and what its log said (`named`: the parser's failure).

    Exit 0 is completed; so is a run whose exit status nobody saw (its wrapper was killed) when every
    output carries a sound manifest written by this very run (`outputs_done`: the stage finished). A stop somebody asked for (`lab stop`, TERM/INT, exit 130) is killed.
    Any other end is failed, with the reason the log named, else the one the exit status suggests:
    SIGKILL or 137 → host_oom_killed (the kernel's OOM killer is the usual sender), 124 → timeout,
    else `other` with the log's last line. jobwrap (exit.json), the parser (state JSON), the
    registry and the notifications all use this function, so a run never ends two ways.
    """
    if signal is None and (exit_code == 0 or exit_code is None and outputs_done):
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
    # A crash by a signal is said as one: SIGSEGV (or a shell's 139) a segfault, any other a signal
    reason = ("segfault" if signal == _signal.SIGSEGV or (signal is None and exit_code == 139)
              else "signal" if signal is not None else "other")
    return Ending(RunState.FAILED, {"reason": reason, "line": None, "process": None,
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


def exit_text(run: "dict | Run") -> str:
    """The exit status in words ("signal 9", "exit code 3", a lost wrapper); "" for exit 0 or none."""
    if isinstance(run, Run):
        run = {k: getattr(run, k) for k in ("signal", "exit_code", "lost", "orphaned")}
    if run.get("signal"):
        return f"signal {run['signal']}"
    if run.get("exit_code") not in (None, 0):
        return f"exit code {run['exit_code']}"
    if run.get("lost"):
        return "jobwrap vanished: host rebooted or wrapper killed"
    if run.get("orphaned"):
        return "orphaned: jobwrap was killed, the stage runs on unsupervised (lab stop stops it)"
    return ""


def how_it_ended(run: "dict | Run") -> str | None:
    """Why a run ended as it did, for people: the parser's diagnosis when there is one, else the
    exit status in words; None when there is nothing to say."""
    ls = run.log_state if isinstance(run, Run) else run.get("log_state")
    failure = ls.get("failure") if isinstance(ls, dict) else None
    if isinstance(failure, dict):
        msg = (failure.get("message") or "").strip()
        return f"{failure.get('reason', 'other')}: {msg}" if msg else str(failure.get("reason"))
    return exit_text(run) or None
