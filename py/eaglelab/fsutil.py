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
    t = _dt.datetime.fromtimestamp(ts, _dt.UTC) if ts is not None else _dt.datetime.now(_dt.UTC)
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
