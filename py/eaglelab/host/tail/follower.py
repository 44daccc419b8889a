"""Read a file that grows, from a byte offset, in bounded chunks; survive truncation and rotation.

The file may not exist yet (it appears later), may be truncated (copytruncate, or a stage that
reopens its log with 'w': the size drops below our offset, so read again from 0), or replaced
(renamed away and created anew: a different inode; finish the old file, then start the new one).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

CHUNK = 128 << 10  # measured: larger reads cost more (allocation of big buffers) than they save


class FileFollower:
    def __init__(self, path: Path, chunk: int = CHUNK) -> None:
        self.path = Path(path)
        self.chunk = chunk
        self.offset = 0
        self.resets = 0          # truncations + rotations seen
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

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
            self.close()
            self.offset = 0
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
        if size < self.offset:
            self.offset = 0
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
            if budget is not None:
                budget -= len(data)
            yield ("data", data)
