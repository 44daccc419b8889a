"""Read a file that grows, from a byte offset, in bounded chunks; survive truncation and rotation.

The file may not exist yet (it appears later), may be truncated (copytruncate, or a stage that
reopens its log with 'w': read again from 0), or replaced (renamed away and created anew: a
different inode; finish the old file, then start the new one). A truncation is seen by size (the
file is shorter than our offset) and by content: the bytes just before our offset are not the ones
we read there (truncated and grown past our offset again while we were not looking).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

CHUNK = 128 << 10  # measured: larger reads cost more (allocation of big buffers) than they save
TAIL = 64  # bytes before the offset kept to recognize the file we read (one small pread per check)


class FileFollower:
    def __init__(self, path: Path, chunk: int = CHUNK) -> None:
        self.path = Path(path)
        self.chunk = chunk
        self.offset = 0
        self.resets = 0          # truncations + rotations seen
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None
        self._tail = b""         # the last TAIL bytes read, ending at offset

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
            self.offset, self._tail = 0, b""
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
        size = os.fstat(self._fd).st_size
        if size < self.offset or (self._tail and size >= self.offset and
                                  os.pread(self._fd, len(self._tail), self.offset - len(self._tail)) != self._tail):
            self.offset, self._tail = 0, b""
            self.resets += 1
            yield ("reset", b"")
        yield from self._drain(budget)

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
