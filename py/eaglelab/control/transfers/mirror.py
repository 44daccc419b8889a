"""The controller's copy of a remote run's log: logs/mirror/HOST/RUN.log.

The host's output.log only grows, so the mirror is always a prefix of it: bytes are appended only
when they continue the mirror exactly where it ends. A cut link leaves a shorter prefix; the next
read resumes from the mirror's size — no byte lost, none written twice. Concurrent `lab` processes
(logs -f, status, cron) take a file lock around the size check and the append.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from filelock import FileLock

from eaglelab.fsutil import open_private_append, private_dir

CHUNK = 1 << 20


def safe_name(name: str) -> str:
    """A file name for any host name (a config key may hold `/`, spaces, `$(...)`)."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or "_"
    if clean != name:
        clean += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return clean


class LogMirror:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, host: str, run_id: str) -> Path:
        return self.root / safe_name(host) / f"{safe_name(run_id)}.log"

    def size(self, host: str, run_id: str) -> int:
        try:
            return self.path(host, run_id).stat().st_size
        except FileNotFoundError:
            return 0

    def offer(self, host: str, run_id: str, offset: int, data: bytes) -> int:
        """Append the part of data (read from the host log at offset) that extends the mirror.
        Returns the bytes appended (0 when data ends before the mirror does or leaves a gap)."""
        if not data:
            return 0
        path = self.path(host, run_id)
        private_dir(self.root)  # a stage's log may hold what its env held: private, as on its host
        private_dir(path.parent)
        with FileLock(str(path) + ".lock", mode=0o600):
            size = path.stat().st_size if path.exists() else 0
            if offset > size or offset + len(data) <= size:
                return 0
            tail = data[size - offset:]
            with open(open_private_append(path), "ab") as f:
                f.write(tail)
                f.flush()
                os.fsync(f.fileno())
            return len(tail)

    def sync(self, executor, run_id: str) -> int:
        """Pull everything the host has beyond the mirror; the mirror's size afterwards.
        Raises HostUnreachable mid-way (what was appended stays: the next sync resumes)."""
        host = executor.host.name
        while True:
            offset = self.size(host, run_id)
            data = executor.read_log(run_id, offset, CHUNK)  # the ssh executor also writes through
            if not data:
                return offset
            self.offer(host, run_id, offset, data)
