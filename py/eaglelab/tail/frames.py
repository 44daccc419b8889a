"""Bytes of a growing log in, lines and \\r-frames out: incremental, bounded, never raising.

- A line ends at `\\n` (`\\r\\n` too). Its visible text is what follows its last `\\r`, as a
  terminal would show it; the `\\r`-terminated frames before that are handed over separately.
- A partial last line waits for its end (flush() gives it up at EOF when the writer is gone).
- Memory is bounded: a line or frame longer than max_line bytes is cut to its first max_line
  bytes and counted as bad; the rest of it is skipped without being kept.
- Invalid UTF-8 is decoded with replacement characters and the line counted as bad.
- Frame runs (tqdm redrawing one bar thousands of times without a newline) are decimated within
  one chunk: all frames of a short run, else `sample` evenly spaced ones plus the last. Live
  tailing reads small chunks, so it sees nearly every frame; a bulk read of a GB log does not
  need to (the bar's history is bounded anyway).
"""

from __future__ import annotations

import re
from collections.abc import Callable

LineSink = Callable[[str, int], None]   # (text, lineno)

MAX_LINE = 64 * 1024
# How a tqdm frame ends: `[elapsed<remaining, rate, postfix]` or `[elapsed, rate]`.
_FRAME_END_RE = re.compile(rb"\[(?:\d+ days?, )?\d+(?::\d\d){1,2}(?:<[^\]]*)?(?:,[^\]]*)?\]$")
SAMPLE = 8


class FrameSplitter:
    def __init__(self, on_line: LineSink, on_frame: LineSink, max_line: int = MAX_LINE, sample: int = SAMPLE,
                 on_provisional: LineSink | None = None) -> None:
        self.on_line = on_line
        self.on_frame = on_frame
        # Live tailing only: the newest tqdm frame, before its terminator comes (it is delivered
        # again, as usual, once terminated). tqdm writes '\r' + frame, so for a slow bar the
        # terminator comes minutes later, with the next frame.
        self.on_provisional = on_provisional
        self.max_line = max_line
        self.sample = sample
        self.lines = 0           # complete lines so far
        self.bad = 0             # lines/frames cut for length or with invalid UTF-8
        self._partial = b""      # bytes after the last terminator (at most max_line)
        self._skipping = False   # inside an over-long line/frame whose head was handed over
        self._held: bytes | None = None  # the partial frame last handed to on_provisional

    def reset(self) -> None:
        """The file was truncated or replaced: forget the partial line (counters go on)."""
        self._partial = b""
        self._skipping = False
        self._held = None

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self._skipping:
            cut = _first_terminator(data)
            if cut < 0:
                return
            self._skipping = False
            data = data[cut:]
        buf = self._partial + data if self._partial else data
        last_nl = buf.rfind(b"\n")
        if last_nl >= 0:
            for line in buf[:last_nl].split(b"\n"):
                self.lines += 1
                self._line(line)
            buf = buf[last_nl + 1:]
        self._tail(buf)

    def flush(self) -> None:
        """At EOF with the writer gone: the partial last line counts as a line."""
        if self._partial or self._skipping:
            self.lines += 1
            self._line(self._partial)
            self._partial = b""
            self._skipping = False
        self._held = None

    # A complete line (without its \n): frames then the visible text.
    def _line(self, line: bytes) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]  # CRLF, or a bar's last frame then newline
        if b"\r" in line:
            frames = line.split(b"\r")
            visible = frames.pop()
            while not visible and frames:
                visible = frames.pop()
            self._frames(frames, self.lines)
            line = visible
        if len(line) > self.max_line:
            line = line[: self.max_line]
            self.bad += 1
        self.on_line(self._decode(line), self.lines)

    # Bytes after the last newline: complete \r-frames now, the rest waits.
    def _tail(self, buf: bytes) -> None:
        # A trailing \r may be half of a \r\n: the frame before it waits for the next byte.
        end = len(buf) - 1 if buf.endswith(b"\r") else len(buf)
        start = buf.rfind(b"\r", 0, end) + 1
        if start > 0:
            self._frames(buf[: start - 1].split(b"\r"), self.lines + 1)
        buf = buf[start:]
        if len(buf) > self.max_line:
            self.bad += 1
            # Hand over the head now and skip the rest up to the next terminator: memory stays bounded.
            self.on_frame(self._decode(buf[: self.max_line]), self.lines + 1)
            self._partial = b""
            self._skipping = True
            self._held = None
            return
        self._partial = buf
        if self.on_provisional is not None:
            core = buf.rstrip(b"\r ")
            if core.endswith(b"]") and core != self._held and _FRAME_END_RE.search(core[-400:]):
                self._held = core
                self.on_provisional(core.decode("utf-8", "replace"), self.lines + 1)

    def _frames(self, frames: list[bytes], lineno: int) -> None:
        frames = [f for f in frames if f]
        if len(frames) > 2 * self.sample:
            step = len(frames) / self.sample
            picked = [frames[int(i * step)] for i in range(self.sample)]
            picked.append(frames[-1])
            frames = picked
        for f in frames:
            if len(f) > self.max_line:
                f = f[: self.max_line]
                self.bad += 1
            self.on_frame(self._decode(f), lineno)

    def _decode(self, b: bytes) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            self.bad += 1
            return b.decode("utf-8", "replace")


def _first_terminator(data: bytes) -> int:
    a, b = data.find(b"\n"), data.find(b"\r")
    if a < 0:
        return b
    if b < 0:
        return a
    return min(a, b)
