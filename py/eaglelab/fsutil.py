"""Small filesystem and clock helpers shared by every module that writes state."""

from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def utcnow_iso(ts: float | None = None) -> str:
    """ISO 8601 UTC with milliseconds and a Z, the one time format of every JSON we write."""
    t = _dt.datetime.fromtimestamp(ts, _dt.timezone.utc) if ts is not None else _dt.datetime.now(_dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def parse_iso(s: str | None) -> float | None:
    """Inverse of utcnow_iso (accepts any ISO 8601 form); None stays None."""
    if not s:
        return None
    return _dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write via a temp file in the same directory + fsync + rename: readers see old or new, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: str | os.PathLike) -> Any | None:
    """The JSON in path, or None if it is absent or half-written (never raises on bad content)."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (FileNotFoundError, NotADirectoryError, ValueError, OSError):
        return None


class NotAFile(OSError):
    """A path that is there but is no regular file (a FIFO, a device, a socket, a directory)."""


MAX_CONF_BYTES = 8 << 20  # a configuration file is a few KiB; anything past this is no config


def read_regular_file(path: str | os.PathLike, limit: int = MAX_CONF_BYTES) -> bytes:
    """The bytes of a regular file, never waiting: opened non-blocking (a FIFO with no writer
    would block a plain open forever, a device like /dev/zero never ends), then refused unless
    fstat says it is a regular file of at most limit bytes. NotAFile names what it is instead."""
    import stat
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                    "a character device" if stat.S_ISCHR(st.st_mode) else
                    "a block device" if stat.S_ISBLK(st.st_mode) else
                    "a socket" if stat.S_ISSOCK(st.st_mode) else
                    "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
            raise NotAFile(f"{kind}, not a regular file")
        if st.st_size > limit:
            raise NotAFile(f"{st.st_size:,} bytes, over the {limit:,} a configuration file may have")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            return f.read(limit + 1)[:limit]
    finally:
        if fd >= 0:
            os.close(fd)

