"""The prefilter: which lines of a block can change the state at all, found once per line shape.

A line-heavy log (a vLLM server's access and request lines) is mostly lines that no recognizer
answers: no bar, no lifecycle or metric line, no failure. Running each through the header, prefix
and every recognizer costs ~8 µs; here a block of complete lines costs a few C passes instead:

- A line's *shape* is its bytes with the digits deleted and a-f written as `a` (`INFO:     ...: -
  "POST /va/aomplations HTTP/." OK`; a request id becomes a run of `a`): a busy log has few shapes.
  Each new shape is searched once for TRIGGERS, in the same writing, a superset of what any
  recognizer, the failure gate or the bar reader needs, and the answer is cached. Deleting or
  rewriting characters keeps every occurrence of a word whole (as the word rewritten alike), so a
  line that holds a trigger word has a shape that holds the rewritten word.
- Lines of a shape with a trigger go through the full path (LogState.feed_line), in order.
- The others change only three things, brought up to date before the next full line and at the
  end of the block: the last non-blank line (what a failure without a reason shows), the log clock
  (the last timed header: vLLM and glog headers, whose value needs only the year, which full-date
  headers set, and those are triggers), and nothing else. Both are found from the end of the run
  (the clock by a C search for a header time over the block's shapes), never line by line.
- While a traceback is open (its lines matter whatever they say), every line takes the full path.

Results are the same as feeding every line (tests/test_parse_golden.py, test_parse_prefilter.py).
"""

from __future__ import annotations

import re

from . import failures, markers, training, vllm
from .prefixes import split_prefix
from .records import parse_record

# Digits and a-f all read `a`: numbers and hex ids of one length have one shape. Lengths stay, so
# a line's offsets are its shape's.
SHAPE_TABLE = bytes.maketrans(b"0123456789abcdef", b"a" * 16)
_STR_TABLE = str.maketrans("0123456789abcdef", "a" * 16)


def _w(word: str) -> str:
    """A literal word as it reads in a shape, escaped for the trigger regex."""
    return re.escape(word.translate(_STR_TABLE))


_SPECULATORS = ("epoch", "heckpoint", "Processing", "Found", "Timing", "Saved", "Skipped", "Preparing", "preparing",
                "Writing dataset", "EAGLE Offline", "Data generation complete!", "Pipeline complete in")
_METRIC_KEYS = ("/", "loss", "acc", "grad_norm", "perplexity", "tokens_per_s")
_FAILURE_WORDS = failures._GATE.pattern.replace('\\"', '"').split("|")
# In shape space (a digit reads `a`). Each names what it stands for.
_TRIGGERS = [
    _w(markers.TAG),                                          # eaglelab's own markers
    *(_w(w) for w in vllm._GATE),                             # vLLM lifecycle and stats (its own gate)
    *(_w(w) for w in _SPECULATORS),                           # speculators' lines (its gate but `=`/`complete`)
    *(_w(w) for w in training.GATE),                          # training plans (HF's banner, the train stage's)
    "(?:" + "|".join(map(_w, _METRIC_KEYS)) + r")[^\s,=]*=|lr=",  # a metric key (speculators._METRIC_KEY_RE)
    *(_w(w) for w in _FAILURE_WORDS),                         # any failure reason or traceback line (failures._GATE)
    *(_w(w) for w in failures.WRAPPER_PAUSE),                 # a wrapper's pause prompt: its program has exited
    re.escape("^M"),                                          # frames written out by `cat -v`
    r"\[a+(?::| aay)|\[\?|%\|",                                # a bar's `[elapsed` (`[1 day, `), Rich's `[hh:mm:ss]` (date-less: the clock needs it), a frame cut at the width
    r"\x1b|[\x00-\x08\x0b-\x1f\x7f]|\[a{1,3}(?:;a{1,3})*m",     # colour codes, their remnants, control bytes
    r"aaaa-aa-aa[ T]aa:aa:aa(?:[.,]a+)?(?:Z|[+-]aa:?aa)?(?: - | \| | \[)",  # a full-date header (sets the clock's year)
]
TRIGGER_RE = re.compile("|".join(f"(?:{t})" for t in _TRIGGERS).encode())
_TIMED = b":aa:"  # every header time is HH:MM:SS
_MAX_SHAPE_BYTES = 8 << 20  # the cache's bound: memory stays constant whatever the log


def shapes_of(blk: bytes) -> list[bytes]:
    """The shape of each line of blk (which ends with a newline)."""
    out = blk.translate(SHAPE_TABLE).split(b"\n")
    out.pop()
    return out


class Shapes:
    """shape -> has a trigger, cached (at most _MAX_SHAPE_BYTES of shapes, then it starts over)."""

    def __init__(self) -> None:
        self.known: dict[bytes, bool] = {}
        self.size = 0  # bytes of the shapes in known

    def flags(self, shapes: list[bytes], max_line: int) -> list[bool] | None:
        """Whether each shape has a trigger; None if a line is over max_line bytes (never cached,
        so only a shape not seen before can be)."""
        known = self.known
        flags = list(map(known.get, shapes))
        if None in flags:  # shapes not seen before: searched once each
            search = TRIGGER_RE.search
            k = -1
            try:
                while True:
                    k = flags.index(None, k + 1)
                    s = shapes[k]
                    if len(s) > max_line:
                        return None
                    got = known.get(s)
                    if got is None:
                        if self.size > _MAX_SHAPE_BYTES:
                            known.clear()
                            self.size = 0
                        got = known[s] = search(s) is not None
                        self.size += len(s) + 100  # the entry's own cost too
                    flags[k] = got
            except ValueError:
                pass
        return flags


def feed_block(st, blk: bytes, first: int, max_line: int, now: float | None) -> int | None:
    """blk's lines (complete, valid UTF-8, no \\r), numbered first, first+1, ..., into st; returns
    how many, or None (nothing fed) when one is over max_line bytes (the caller cuts it)."""
    tblk = blk.translate(SHAPE_TABLE)
    shapes = tblk.split(b"\n")
    shapes.pop()
    flags = st.shapes.flags(shapes, max_line)
    if flags is None:
        return None
    n = len(shapes)
    i = off = 0  # line i starts at blk[off]
    tb = st._failures._tb  # open tracebacks, by prefix
    while i < n:
        if tb:
            end = off + len(shapes[i])
            st.feed_line(blk[off:end].decode(), first + i, now)
            i, off = i + 1, end + 1
            continue
        try:
            j = flags.index(True, i)
        except ValueError:
            j = n
        if j > i:
            start = off
            off += sum(map(len, shapes[i:j])) + (j - i)
            _plain(st, blk, tblk, shapes, i, j, start, off, first)
        if j < n:
            end = off + len(shapes[j])
            st.feed_line(blk[off:end].decode(), first + j, now)
            off = end + 1
        i = j + 1
    return n


def _plain(st, blk: bytes, tblk: bytes, shapes: list[bytes], a: int, b: int, start: int, stop: int,
           first: int) -> None:
    """Lines a..b-1 (blk[start:stop]) have no trigger: only the last line shown and the clock move."""
    end = stop - 1  # the newline of line b-1
    for k in range(b - 1, a - 1, -1):
        begin = end - len(shapes[k])
        msg = split_prefix(blk[begin:end].decode()).message
        if msg and not msg.isspace():
            st.last_line, st.last_line_no = msg, first + k
            break
        end = begin - 1
    # The clock: the last header with a time decides it (see above). One with an impossible date
    # gives None and changes nothing, so the last good one before it is read too, for the day.
    # The timed lines are found from the end by a C search over the block's shapes (tblk), not
    # line by line: between two lines that matter, a busy server writes hundreds of untimed ones.
    got = _NONE = object()
    clock = st.clock
    hi = stop - 1  # search [start, hi): the lines not looked at yet
    while hi > start:
        pos = tblk.rfind(_TIMED, start, hi)
        if pos < 0:
            break
        begin = max(tblk.rfind(b"\n", start, pos) + 1, start)
        end = tblk.find(b"\n", pos, stop)
        rec = parse_record(split_prefix(blk[begin:end].decode()).message)
        if rec.time is not None:
            t = clock.seconds(rec)
            if got is _NONE:
                got = t
            if t is not None:
                break
        hi = begin
    if got is not _NONE:
        st._log_t = got
