"""Bytes of a growing log in, lines and \\r-frames out: incremental, bounded, never raising.

- A line ends at `\\n` (`\\r\\n` too). Its visible text is what follows its last `\\r`, as a
  terminal would show it; the `\\r`-terminated frames before that are handed over separately.
- A partial last line waits for its end (flush() gives it up at EOF when the writer is gone).
- Memory is bounded: a line or frame longer than max_line bytes is cut to its first max_line
  bytes and counted as bad; the rest of it is skipped without being kept.
- Invalid UTF-8 is decoded with replacement characters and the line counted as bad.
- Frame runs (tqdm redrawing one bar thousands of times without a newline) are decimated: all
  frames of a short run, else one frame per sample_bytes of the stream (a line's last frame is
  its visible text and always seen). Live tailing reads small
  chunks, so it sees every frame; a bulk read of a GB log does not need to (the bar's history is
  bounded anyway). sample_bytes=0 hands over every frame (a replay that wants them all).
"""

from __future__ import annotations

import re
from collections.abc import Callable

LineSink = Callable[[str, int], None]   # (text, lineno)
# (bytes, first lineno, max_line) -> lines taken, or None when declined (an over-long line): a run
# of complete lines without \r at once (LogState.feed_block)
BlockSink = Callable[[bytes, int, int], "int | None"]

MAX_LINE = 64 * 1024
SAMPLE_BYTES = 256 * 1024 # in a long run of frames, look at one frame per this many bytes (+ the last)
SMALL_RUN = 4096          # a run of frames up to this size is handed over whole
CLEAR_MAX = 1024          # a blank frame up to this long is a bar being cleared (tqdm pads to the terminal)
MIN_BLOCK = 512           # a run of complete lines without \r at least this long goes to on_block
# How a tqdm frame ends: `[elapsed<remaining, rate, postfix]` or `[elapsed, rate]`.
_FRAME_END_RE = re.compile(rb"\[(?:\d+ days?, )?\d+(?::\d\d){1,2}(?:<[^\]]*)?(?:,[^\]]*)?\]$")


class FrameSplitter:
    def __init__(self, on_line: LineSink, on_frame: LineSink, max_line: int = MAX_LINE,
                 sample_bytes: int = SAMPLE_BYTES, on_provisional: LineSink | None = None,
                 on_block: BlockSink | None = None) -> None:
        self.on_line = on_line
        # Runs of complete lines without \r (a line-heavy log), handed over at once (for the
        # prefilter, eaglelab.host.parse.prefilter); None: every line goes to on_line.
        self.on_block = on_block
        self.on_frame = on_frame
        self.sample_bytes = sample_bytes  # 0: every frame (e.g. to replay a whole bar history)
        # Live tailing only: the newest tqdm frame, before its terminator comes (it is delivered
        # again, as usual, once terminated). tqdm writes '\r' + frame, so for a slow bar the
        # terminator comes minutes later, with the next frame.
        self.on_provisional = on_provisional
        self.max_line = max_line
        self.lines = 0           # complete lines so far
        self.bad = 0             # lines/frames cut for length or with invalid UTF-8
        self._partial = b""      # bytes after the last terminator (at most max_line)
        self._skipping = False   # inside an over-long line/frame whose head was handed over
        self._held: bytes | None = None  # the partial frame last handed to on_provisional
        self._fed = 0            # bytes fed so far (stream offset)
        self._base = 0           # stream offset of the buffer being worked on
        self._due = 0            # stream offset from which the next sampled frame is taken

    def reset(self) -> None:
        """The file was truncated or replaced: forget the partial line (counters go on)."""
        self._partial = b""
        self._skipping = False
        self._held = None

    def feed(self, data: bytes) -> None:
        if not data:
            return
        fed = self._fed
        self._fed += len(data)
        a = 0
        if self._skipping:
            a = _first_terminator(data, 0, len(data))
            if a < 0:
                return
            self._skipping = False
        if self._partial:
            buf = self._partial + (data[a:] if a else data)
            self._base, a = fed + a - len(self._partial), 0
        else:
            buf, self._base = data, fed
        self._work(buf, a, len(buf))

    def feed_file(self, f, chunk: int = 1 << 20) -> None:
        """Feed a whole binary file object through one reused buffer: no allocation per read."""
        buf = bytearray(chunk + self.max_line + 1)
        view = memoryview(buf)
        while True:
            p = len(self._partial)
            if p:
                buf[:p] = self._partial
            n = f.readinto(view[p:p + chunk])
            if not n:
                return
            fed = self._fed
            self._fed += n
            a = 0
            if self._skipping:  # then p == 0
                a = _first_terminator(buf, 0, n)
                if a < 0:
                    continue
                self._skipping = False
            self._base = fed - p
            self._work(buf, a, p + n)

    # Work on offsets into buf: a tqdm "line" is often megabytes of frames, never copied whole.
    def _work(self, buf, a: int, end: int) -> None:
        if self.on_block is not None:
            a = self._blocks(buf, a, end)
        find = buf.find
        while True:
            nl = find(b"\n", a, end)
            if nl < 0:
                break
            self.lines += 1
            self._line(buf, a, nl)
            a = nl + 1
        self._tail(buf, a, end)

    def _blocks(self, buf, a: int, end: int) -> int:
        """Hand runs of complete lines without \r in buf[a:end] to on_block, lines with a \r to
        _line; returns where the complete lines end."""
        find, rfind = buf.find, buf.rfind
        last = rfind(b"\n", a, end)
        while a <= last:
            r = find(b"\r", a, last)
            stop = last + 1 if r < 0 else max(a, rfind(b"\n", a, r) + 1)
            if stop - a >= MIN_BLOCK:
                self._block(bytes(memoryview(buf)[a:stop]), a, buf)  # one copy (buf may be reused)
            else:
                self._each_line(buf, a, stop)
            if r < 0:
                return last + 1
            nl = find(b"\n", r, end)  # the line holding the \r
            self.lines += 1
            self._line(buf, stop, nl)
            a = nl + 1
        return a

    def _block(self, blk: bytes, a: int, buf) -> None:
        n = None
        try:
            if blk.isascii() or blk.decode("utf-8"):
                n = self.on_block(blk, self.lines + 1, self.max_line)
        except UnicodeDecodeError:
            pass
        if n is None:  # invalid UTF-8 or an over-long line: line by line, which mends and counts them
            self._each_line(buf, a, a + len(blk))
        else:
            self.lines += n

    def _each_line(self, buf, a: int, stop: int) -> None:
        find = buf.find
        while a < stop:
            nl = find(b"\n", a, stop)
            self.lines += 1
            self._line(buf, a, nl)
            a = nl + 1

    def flush(self) -> None:
        """At EOF with the writer gone: the partial last line counts as a line."""
        if self._partial or self._skipping:
            self.lines += 1
            self._line(self._partial, 0, len(self._partial))
            self._partial = b""
            self._skipping = False
        self._held = None

    # A complete line buf[a:b] (without its \n): frames, then the visible text.
    def _line(self, buf: bytes, a: int, b: int) -> None:
        if b > a and buf[b - 1] == 13:
            b -= 1  # CRLF, or a bar's last frame then newline
        cut = buf.rfind(b"\r", a, b)
        if cut >= 0:
            end = b
            # `frame\r\r\n`, or `frame\r<spaces>\r\n` (tqdm's leave=False clearing its bar): the last
            # frame with text is what shows, so a sampled run still ends at its bar's final count
            while cut > a and (cut + 1 == end or (end - cut <= CLEAR_MAX and not buf[cut + 1:end].strip())):
                end = cut
                cut = buf.rfind(b"\r", a, end)
            if cut > a:
                self._frames(buf, a, cut, self.lines)
            a, b = (cut + 1, end) if cut >= 0 else (a, end)
        if b - a > self.max_line:
            b = a + self.max_line
            self.bad += 1
        self.on_line(self._decode(buf[a:b]), self.lines)

    # Bytes buf[a:] after the last newline: complete \r-frames now, the rest waits.
    def _tail(self, buf, a: int, total: int) -> None:
        # A trailing \r may be half of a \r\n: the frame before it waits for the next byte.
        end = total - 1 if total > a and buf[total - 1] == 13 else total
        start = max(a, buf.rfind(b"\r", a, end) + 1)
        if start > a:
            self._frames(buf, a, start - 1, self.lines + 1)
        if total - start > self.max_line:
            self.bad += 1
            # Hand over the head now and skip the rest up to the next terminator: memory stays bounded.
            self.on_frame(self._decode(buf[start:start + self.max_line]), self.lines + 1)
            self._partial = b""
            self._skipping = True
            self._held = None
            return
        self._partial = bytes(buf[start:total])
        if self.on_provisional is not None:
            core = self._partial.rstrip(b"\r ")
            if core.endswith(b"]") and core != self._held and _FRAME_END_RE.search(core[-400:]):
                self._held = core
                self.on_provisional(core.decode("utf-8", "replace"), self.lines + 1)

    def _frames(self, buf: bytes, a: int, end: int, lineno: int) -> None:
        """The \\r-separated frames in buf[a:end]; a long run is sampled: one frame per sample_bytes.

        Sampling finds frames with find/rfind instead of splitting the run: a run is often
        megabytes of one bar redrawn, and only a few of its frames say anything new.
        """
        while a < end and buf[a] == 13:  # tqdm starts every frame with \r
            a += 1
        step = self.sample_bytes
        if not step or end - a <= SMALL_RUN:
            picked = buf[a:end].split(b"\r")
        else:
            # One frame per `step` bytes of the stream, wherever chunks and lines begin and end.
            # A run's last frame needs no special care: it is the line's visible text (or the
            # partial line, at EOF).
            picked = []
            pos, base = a, self._base
            while pos < end:
                due = self._due - base
                if due > pos:
                    f0 = buf.find(b"\r", due - 1, end)
                    if f0 < 0:
                        break
                    pos = f0 + 1
                f1 = buf.find(b"\r", pos, end)
                picked.append(buf[pos:f1 if f1 >= 0 else end])
                self._due = base + pos + step
                if f1 < 0:
                    break
                pos = f1 + 1
        for f in picked:
            if not f:
                continue
            if len(f) > self.max_line:
                f = f[: self.max_line]
                self.bad += 1
            self.on_frame(self._decode(f), lineno)

    def _decode(self, b) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            self.bad += 1
            return b.decode("utf-8", "replace")


def _first_terminator(data, start: int, end: int) -> int:
    a, b = data.find(b"\n", start, end), data.find(b"\r", start, end)
    if a < 0:
        return b
    if b < 0:
        return a
    return min(a, b)
