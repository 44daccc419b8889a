"""Failure candidates with a reason from the fixed vocabulary.

A candidate is a line that would explain the end of the process: the exception line that closes
a Python traceback, a shell's `Killed`, torchrun's `exitcode: -9`, an NCCL watchdog timeout, ...
Whether it ends the run is the state machine's call (a caught-and-logged traceback is followed by
more progress; a run that exits 0 completed). Here, only the guard against false alarms that a
single line can show: nothing logged at DEBUG/INFO/WARNING is a failure (`WARNING ... Failed to
import from vllm._C with ImportError(...)`, `Sending process 12 closing signal SIGTERM`,
`Retrying request`), and code lines inside a traceback (`raise ChildFailedError(`) are not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# An interactive shell's job line for its child, up to the word that says how it ended: bash
# `[1]+  Killed   python x.py`, zsh `[1]    26478 killed     python x.py` (often glued to a frame).
_JOB = r"^\[\d+\]\s*[+-]?\s+(?:\d+\s+)?"
# Most specific first: the first pattern that matches names the reason.
_REASONS: list[tuple[str, re.Pattern[str]]] = [
    # A device-side assert first: it surfaces inside NCCL errors and C++ aborts that would name
    # something else (`NCCL error ... CUDA error: device-side assert triggered`); the kernel's own
    # line is `File.cu:92: operator(): block: [0,0,0], thread: [0,0,0] Assertion `...` failed.`
    ("cuda_assert", re.compile(
        r"device-side assert triggered|cudaErrorAssert|\.cu:\d+: .*Assertion `|block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion")),
    # A scheduler's time limit (Slurm: `slurmstepd: error: *** JOB 42 ON n1 CANCELLED AT ... DUE TO TIME LIMIT ***`)
    ("time_limit", re.compile(r"DUE TO TIME LIMIT|\bexceeded (?:its |the )?time limit\b|\bTIME LIMIT\b.*\bCANCELLED\b")),
    ("cuda_oom", re.compile(
        r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory|HIP out of memory"
        r"|No available memory for the cache blocks|CUBLAS_STATUS_ALLOC_FAILED"
        r"|(?i:cuda[^\n]{0,60}\bout of memory)|THCudaCheck FAIL.*out of memory")),  # old torch: `cuda runtime error (2) : out of memory`
    ("disk_full", re.compile(r"No space left on device|Errno 28\b|StorageFull|Disk quota exceeded|Errno 122\b")),
    ("nccl_error", re.compile(
        r"Watchdog caught collective operation timeout|ProcessGroupNCCL|NCCL (?:error|Error|timeout|WARN.*(?:failed|error))"
        r"|nccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)Error|NCCL communicator|DistBackendError"
        r"|ncclCommInitRank")),  # a worker's traceback through NCCL's init (its exception line often cut off)
    # A CUDA runtime error that is not memory: an illegal access, a device-side assert, a C++ abort
    # (`terminate called after throwing an instance of 'c10::CUDAError'`, `what():  CUDA error: ...`).
    ("cuda_error", re.compile(
        r"CUDA error: |c10::CUDAError|cudaError[A-Z]\w+|illegal memory access|device-side assert"
        r"|CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|CUDA driver error")),
    ("host_oom_killed", re.compile(
        r"^Killed\s*$|\bline \d+:\s+\d+ Killed\b|Killed process \d+|Out of memory: Kill|oom-kill|oom_kill"
        rf"|{_JOB}[Kk]illed\s+\S|^zsh: killed\s"  # a shell's job line (_JOB), zsh's own
        r"|exitcode\s*: -9\b|Signal 9 \(SIGKILL\)|Signals\.SIGKILL|signal SIGKILL|died with signal 9|got signal: 9\b")),
    # A crash by SIGSEGV (the shell's `Segmentation fault`, torchrun's `exitcode: -11`, `Signal 11 (SIGSEGV)`)
    ("segfault", re.compile(
        rf"Segmentation fault|^zsh: segmentation fault\b|{_JOB}segmentation fault\s|SIGSEGV|exitcode\s*: -11\b|Signal 11\b|got signal: 11\b|died with signal 11\b")),
    # Death by another signal: torchrun's `SignalException: Process 9 got signal: 15`, its summary's
    # `exitcode: -15` / `Signal 15 (SIGTERM) received by PID`: not a Python exception of the stage's own.
    ("signal", re.compile(
        r"\bSignalException\b|got signal: \d+|exitcode\s*: -(?:1|2|3|6|7|8|10|13|14|15)\b"
        r"|Signal (?:1|2|3|6|7|10|13|14|15) \(SIG\w+\) received|died with signal \d+"
        r"|CANCELLED AT \S+ (?i:due to signal)")),  # Slurm's `*** JOB 42 ON n1 CANCELLED AT ... DUE to SIGNAL Terminated ***`
    # Slurm cancelled the job: `scancel` (`*** JOB 42 ON n1 CANCELLED AT 2025-03-01T12:00:03 ***`), or preempted it
    ("killed", re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT \S+(?: DUE TO PREEMPTION)? \*\*\*")),
    ("import_error", re.compile(
        r"\b(?:ImportError|ModuleNotFoundError)\b|undefined symbol|cannot open shared object file|No module named")),
    ("timeout", re.compile(r"\bTimeoutError\b|\b(?:Read|Connect|Pool)Timeout\b|TimeoutExpired|DeadlineExceeded|timed out")),
    ("other", re.compile(
        r"core dumped|Fatal Python error|Bus error|Floating point exception|Illegal instruction"
        r"|^jobwrap: cannot start|Aborted\s*$|terminate called after throwing"
        # uvicorn could not bind its port (another server holds it): it shuts down and exits 1, its
        # `Application shutdown complete.` notwithstanding
        r"|error while attempting to bind on address")),
]
# Named causes beat these two when a log has several candidates (a C++ abort's `terminate called`
# is `other`, its `what():  CUDA error` line says why).
GENERIC = frozenset(("other", "python_exception", "killed"))
# Causes that win over any other candidate of the log, wherever they stand: the scheduler's time
# limit (the SIGTERM and tracebacks after it follow from it), a device-side assert (the NCCL error
# or abort that reports it later, or first, follows from it).
ROOT_CAUSES = ("time_limit", "cuda_assert")
# Reasons a free-text line (not an exception line, not inside a traceback) is not enough for:
# `'(ReadTimeoutError(...))' thrown while requesting HEAD ...` is a retry, not the end.
_NEEDS_EXCEPTION = frozenset(("timeout",))
# Words one of the reasons above needs: a line with none of them is skipped at once.
_GATE = re.compile(
    r"Error|error|Exception|Memory|memory|space|Errno|Full|quota|NCCL|nccl|Killed|Kill|kill|exitcode|SIGKILL|Signal"
    r"|undefined symbol|shared object|No module|Timeout|timed out|Deadline|fault|dumped|Fatal|Bus|Floating|Illegal"
    r"|jobwrap|Aborted|Traceback|Interrupt|Exit|terminate|assert|Assertion|CUDA|File \"|TIME LIMIT|time limit|SIGSEGV"
    r"|SIGTERM|got signal|death signal|CANCELLED")
# A wrapper script's prompt once its program has exited (a Windows `.bat`'s `pause`): not a reason
# itself, the state machine reads it as the program's end (LogState._died_before_the_pause).
WRAPPER_PAUSE = ("Press any key to continue", "请按任意键继续")
# Logged at INFO or WARNING, still the end of the process when nothing follows: the process says
# it was told to stop (`Received SIGTERM`, torchrun's `Received Signals.SIGTERM death signal`,
# vLLM's `trigger received signal=SIGTERM`). A run that goes on afterwards survives it, like any
# candidate; `Sending process 12 closing signal SIGTERM` (to another process) is not one.
_KILLED_QUIET = re.compile(
    r"(?:[Rr]eceived|[Rr]eceiving|got) (?:the )?(?:signal[ =:]*)?(?:Signals\.)?SIGTERM\b|SIGTERM received")
_DEATH_SIGNAL = re.compile(r"Received (?:(?P<n>\d+)|Signals\.(?P<name>SIG\w+)) death signal")
# A traceback's frame line: an excerpt (or a log read from the middle) can start inside one.
_FRAME_RE = re.compile(r'\s*File "[^"]+", line \d+')
# `ValueError: msg`, `torch.OutOfMemoryError: msg`, `KeyboardInterrupt` at the start of an unindented line.
_EXC_RE = re.compile(r"(?P<name>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?::\s(?P<msg>.*)|:?\s*$)")
_FATAL_NAME_RE = re.compile(r"(?:Error|Exception|Interrupt|Exit|Failure|Fault)$")
_NOT_EXC = ("During handling", "The above exception", "Traceback", "Exception in thread")
_TB_MAX_LINES = 400  # a traceback without its exception line after this many lines was cut off
_QUIET_LEVELS = frozenset(("DEBUG", "INFO", "WARNING"))
_EXITCODE_RE = re.compile(r"exitcode\s*: [1-9]\d*\b")


@dataclass(slots=True)
class Candidate:
    reason: str
    message: str
    line: int
    prefix: str
    specific: bool  # a named cause (cuda_oom ...), not just "some exception"


def classify(text: str) -> str | None:
    """The reason a line names, or None."""
    for reason, pattern in _REASONS:
        if pattern.search(text):
            return reason
    return None


class FailureRecognizer:
    """Follows tracebacks per process prefix and yields candidates; one instance per log."""

    def __init__(self) -> None:
        self._tb: dict[str, int] = {}  # prefix -> lines seen since `Traceback (most recent call last):`
        self._tb_at: dict[str, tuple[int, str | None]] = {}  # prefix -> (its first line, a reason its lines named)

    def feed(self, prefix: str, level: str | None, message: str, lineno: int) -> Candidate | None:
        if prefix not in self._tb and ("SIG" in message or "signal" in message):
            # whatever the level (often INFO or WARNING): the process says it was told to stop
            if _KILLED_QUIET.search(message):
                return Candidate("killed", message.strip(), lineno, prefix, True)
            m = _DEATH_SIGNAL.search(message)
            if m is not None:  # torchrun's agent: `Received 15 death signal, shutting down workers`
                term = m.group("n") == "15" or m.group("name") == "SIGTERM"
                return Candidate("killed" if term else "signal", message.strip(), lineno, prefix, True)
        if level in _QUIET_LEVELS:
            # A wrapper that relays its child's stderr at INFO (`... - INFO - Traceback (most recent
            # call last):`): the traceback is followed like any; a run that goes on survives it.
            if level != "INFO" or (prefix not in self._tb and "Traceback (most recent call last)" not in message
                                   and not _FRAME_RE.match(message)):
                return None
        in_tb = prefix in self._tb
        if not in_tb and _GATE.search(message) is None:
            return None
        if "Traceback (most recent call last)" in message:
            self._tb[prefix] = 0
            self._tb_at[prefix] = (lineno, None)
            # `Exception in worker ... while processing method init_device: NCCL error: ..., Traceback (most
            # recent call last):`: the cause is named before the traceback that follows.
            head = message[:message.index("Traceback (most recent call last)")]
            reason = classify(head) if head.strip() else None
            if reason is not None and reason not in _NEEDS_EXCEPTION:
                return Candidate(reason, head.strip(" ,:"), lineno, prefix, True)
            return None
        if not in_tb and _FRAME_RE.match(message):
            self._tb[prefix] = 0  # the middle of a traceback whose first line is not in the log
            self._tb_at[prefix] = (lineno, None)
            in_tb = True
        text = message.strip(" │┃|")
        indented = message[:1] in (" ", "\t", "│", "┃", "╭", "╰", "|")
        if in_tb:
            self._tb[prefix] += 1
            if self._tb[prefix] > _TB_MAX_LINES:
                del self._tb[prefix]
                return None
            first, named = self._tb_at[prefix]
            if named is None and text:
                self._tb_at[prefix] = (first, classify(text))
            if indented or not text or text.startswith(("^", "~", "[Previous line", "...", "File ")):
                return None
            m = _EXC_RE.fullmatch(text)
            if m is None or text.startswith(_NOT_EXC):
                return None
            del self._tb[prefix]
            reason = classify(text)
            return Candidate(reason or "python_exception", text, lineno, prefix, reason is not None)
        reason = classify(text)  # indented too: torchrun's failure summary is (`  exitcode  : -9`)
        if reason is not None and reason in _NEEDS_EXCEPTION and not _is_exception_line(text):
            reason = None
        if reason is not None:
            return Candidate(reason, text, lineno, prefix, True)
        if _EXITCODE_RE.match(text):  # torchrun's summary: its child exited non-zero (the cause is above, or cut)
            return Candidate("python_exception", text, lineno, prefix, False)
        if indented:
            return None
        m = _EXC_RE.fullmatch(text)
        if m is not None and _FATAL_NAME_RE.search(m.group("name")) and not text.startswith(_NOT_EXC):
            return Candidate("python_exception", text, lineno, prefix, False)
        return None

    def open_tracebacks(self) -> list[Candidate]:
        """Tracebacks still open when the log ends (a finished file, or a run that has exited): the
        process died inside one, or its exception line was lost. Each is a failure, with the reason
        its lines named (e.g. `ncclCommInitRank`), else python_exception."""
        out = []
        for prefix, (first, named) in self._tb_at.items():
            if prefix in self._tb:
                out.append(Candidate(named or "python_exception",
                                     "the log ends inside a traceback (its exception line is not in the log)",
                                     first, prefix, named is not None))
        return out


def _is_exception_line(text: str) -> bool:
    """`requests.exceptions.ReadTimeout: (...)`, `TimeoutError: ...`: an exception, not a log message."""
    m = _EXC_RE.fullmatch(text)
    return m is not None and m.group("name").endswith(("Error", "Exception", "Timeout", "Expired", "Exceeded"))
