"""The prefilter: which lines of a block can change the state at all, found once per line shape.

A line-heavy log (a vLLM server's access and request lines) is mostly lines that no recognizer
answers: no bar, no lifecycle or metric line, no failure. Running each through the header, prefix
and every recognizer costs ~8 µs; here a block of complete lines costs a few C passes instead:

- A line's *shape* is its bytes with the digits deleted (`INFO:     ...: - "POST /v1/completions
  HTTP/." OK`): a busy log has few shapes. Each new shape is searched once for TRIGGERS, a superset
  of what any recognizer, the failure gate or the bar reader needs (deleting digits keeps every
  digit-free word whole, and every trigger is digit-free), and the answer is cached.
- Lines of a shape with a trigger go through the full path (LogState.feed_line), in order.
- The others change only three things, brought up to date before the next full line and at the
  end of the block: the last non-blank line (what a failure without a reason shows), the log clock
  (the last timed header: vLLM and glog headers, whose value needs only the year, which full-date
  headers set, and those are triggers), and nothing else.
- While a traceback is open (its lines matter whatever they say), every line takes the full path.

Results are the same as feeding every line (tests/test_parse_golden.py, test_parse_prefilter.py).
"""

from __future__ import annotations

import copy
import re

from . import failures, markers, vllm
from .prefixes import split_prefix
from .records import parse_record

DIGITS = b"0123456789"
_SPECULATORS = ("epoch", "heckpoint", "Processing", "Found", "Timing", "Saved", "Skipped", "Preparing", "preparing",
                "Writing dataset", "EAGLE Offline", "Data generation complete!", "Pipeline complete in")
# In shape space (digits gone). Each names what it stands for; all are digit-free.
_TRIGGERS = [
    re.escape(markers.TAG),                                   # eaglelab's own markers
    *(re.escape(w) for w in vllm._GATE),                      # vLLM lifecycle and stats (its own gate)
    *(re.escape(w) for w in _SPECULATORS),                    # speculators' lines (its gate but `=`/`complete`)
    r"(?:/|loss|acc|grad_norm|perplexity|tokens_per_s)[^\s,=]*=|lr=",  # a metric key (speculators._METRIC_KEY_RE)
    failures._GATE.pattern,                                   # any failure reason or traceback line
    r"\[(?::|\?| day)",                                       # a bar's `[elapsed`, Rich's `[hh:mm:ss]` (date-less: the clock needs it)
    r"\x1b|[\x00-\x08\x0b-\x1f\x7f]|\[;*m",                   # colour codes, their remnants, control bytes
    r"--[ T]::[.,]?(?:Z|[+-]:?)?(?: - | \| | \[)",            # a full-date header (sets the clock's year)
]
TRIGGER_RE = re.compile("|".join(f"(?:{t})" for t in _TRIGGERS).encode())
_MAX_SHAPES = 1 << 16


class Shapes:
    """shape -> has a trigger, cached (bounded)."""

    def __init__(self) -> None:
        self.known: dict[bytes, bool] = {}

    def flags(self, shapes: list[bytes]) -> list[bool]:
        known = self.known
        new = set(shapes).difference(known)
        if new:
            if len(known) + len(new) > _MAX_SHAPES:
                known.clear()
                new = set(shapes)
            search = TRIGGER_RE.search
            for s in new:
                known[s] = search(s) is not None
        return list(map(known.__getitem__, shapes))


def feed_block(st, lines: list[bytes], shapes: list[bytes], first: int, now: float | None) -> None:
    """Complete lines (valid UTF-8, no \\r, none over-long) numbered first, first+1, ... into st."""
    flags = st.shapes.flags(shapes)
    n = len(lines)
    i = 0
    tb = st._failures._tb  # open tracebacks, by prefix
    while i < n:
        if tb:
            st.feed_line(lines[i].decode(), first + i, now)
            i += 1
            continue
        try:
            j = flags.index(True, i)
        except ValueError:
            j = n
        if j > i:
            _plain(st, lines, shapes, i, j, first)
        if j < n:
            st.feed_line(lines[j].decode(), first + j, now)
        i = j + 1


def _plain(st, lines: list[bytes], shapes: list[bytes], a: int, b: int, first: int) -> None:
    """Lines a..b-1 have no trigger: only the last line shown and the clock move."""
    for k in range(b - 1, a - 1, -1):
        msg = split_prefix(lines[k].decode()).message
        if msg and not msg.isspace():
            st.last_line, st.last_line_no = msg, first + k
            break
    # The clock: the last header with a time decides it (see above); one with an impossible date
    # (the clock gives None) is replayed with the ones after the last good one, as feeding would.
    replay = []
    for k in range(b - 1, a - 1, -1):
        if b"::" not in shapes[k]:
            continue
        rec = parse_record(split_prefix(lines[k].decode()).message)
        if rec.time is None:
            continue
        replay.append(rec)
        if copy.copy(st.clock).seconds(rec) is not None:
            break
    for rec in reversed(replay):
        st._log_t = st.clock.seconds(rec)
