"""Read a file that grows, from a byte offset, in bounded chunks; survive truncation and rotation.

The file may not exist yet (it appears later), may be truncated (copytruncate, or a stage that
reopens its log with 'w': read again from 0), or replaced (renamed away and created anew: a
different inode; finish the old file, then start the new one). A truncation is seen by size (the
file is shorter than our offset, or than the size we last saw: copytruncate while we lagged), by
content (the bytes just before our offset are not the ones we read there: truncated and grown past
our offset again while we were not looking) and, for a log of identical lines that the content
cannot tell apart, by a rewrite to the very size we saw: the same size but written since (its
mtime moved, and it does not grow on: an append in progress changes the mtime before the size).
Not seen: a log of identical lines truncated and grown past the size we last saw between two
looks (nothing in the file differs from an append then).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

CHUNK = 128 << 10  # measured: larger reads cost more (allocation of big buffers) than they save
TAIL = 64  # bytes before the offset kept to recognize the file we read (one small pread per check)
SETTLE_S = 0.05  # the same size, a new mtime: look again after this long before calling it a rewrite


class FileFollower:
    def __init__(self, path: Path, chunk: int = CHUNK) -> None:
        self.path = Path(path)
        self.chunk = chunk
        self.offset = 0
        self.resets = 0          # truncations + rotations seen
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None
        self._tail = b""         # the last TAIL bytes read, ending at offset
        self._seen: tuple[int, int] | None = None  # (size, mtime_ns) of the open file at the last look

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def unread(self) -> int:
        """Bytes of the open file past our offset (0 before it is opened)."""
        if self._fd is None:
            return 0
        try:
            return max(os.fstat(self._fd).st_size - self.offset, 0)
        except OSError:
            return 0

    def read_new(self, max_bytes: int | None = None) -> Iterator[tuple[str, bytes]]:
        """Yield ('data', bytes) for what was appended, ('reset', b'') when the file started over."""
        budget = max_bytes
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and self._ident not in (None, (st.st_dev, st.st_ino)):
            # Rotated: drain the old file through our open descriptor, then switch.
            yield from self._drain(budget)
            if self.unread():
                return  # the budget ran out first: the old file's rest comes at the next call
            self.close()
            self.offset, self._tail, self._seen = 0, b"", None
            self.resets += 1
            yield ("reset", b"")
        if st is None:
            return
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return
            fst = os.fstat(self._fd)
            self._ident = (fst.st_dev, fst.st_ino)
        fst = os.fstat(self._fd)
        size = fst.st_size
        if size < self.offset or self._started_over(fst) or (
                self._tail and size >= self.offset and
                os.pread(self._fd, len(self._tail), self.offset - len(self._tail)) != self._tail):
            self.offset, self._tail = 0, b""
            self.resets += 1
            yield ("reset", b"")
        self._seen = (size, fst.st_mtime_ns)
        yield from self._drain(budget)

    def _started_over(self, fst: os.stat_result) -> bool:
        """Emptied and written again since the last look although the bytes before our offset read
        the same (a log of identical lines): now smaller than it was then, or of the very size it
        was but written since (and not an append caught between its mtime and its size)."""
        if self._seen is None:
            return False
        size, mtime = self._seen
        if fst.st_size < size:
            return True
        if fst.st_size > size or fst.st_mtime_ns == mtime:
            return False
        time.sleep(SETTLE_S)
        return os.fstat(self._fd).st_size == size

    def _drain(self, budget: int | None) -> Iterator[tuple[str, bytes]]:
        if self._fd is None:
            return
        while budget is None or budget > 0:
            n = self.chunk if budget is None else min(self.chunk, budget)
            data = os.pread(self._fd, n, self.offset)
            if not data:
                return
            self.offset += len(data)
            self._tail = (self._tail + data[-TAIL:])[-TAIL:]
            if budget is not None:
                budget -= len(data)
            yield ("data", data)
