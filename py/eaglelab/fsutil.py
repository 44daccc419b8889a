"""Small filesystem and clock helpers shared by every module that writes state."""

from __future__ import annotations

import datetime as _dt
import json
import os
import stat
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


def private_dir(path: str | os.PathLike) -> Path:
    """A folder only this user can enter (0700), as the host's run directories are: made so if
    missing, tightened if it is ours and open to others (logs written before this rule)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.stat(p)
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(p, stat.S_IMODE(st.st_mode) & 0o700)
    return p


def open_private_append(path: str | os.PathLike) -> int:
    """A file descriptor appending to path, a file only this user can read (0600; tightened if
    it was made wider before)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    st = os.fstat(fd)
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o600)
    return fd


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


class UntrustedFolder(OSError):
    """A folder the lab writes in that another user could rename, replace or fill."""


def untrusted_folder(path: str | os.PathLike) -> str | None:
    """Why the folder at path cannot be trusted with the lab's files, or None. The folder itself
    must be a real directory (not a link) of this user that nobody else may write to; each folder
    above it must belong to this user or root and, if others may write to it, be sticky (as /tmp
    is: nobody can rename what is ours there). A pre-made 0777 `runs/` of another user let them
    rename a live run's directory."""
    import stat
    uid = os.getuid()
    p = Path(os.path.abspath(path))
    st = os.lstat(p)
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISDIR(st.st_mode):
        return f"{p} is not a directory (a link or a file in its place)"
    if st.st_uid != uid:
        return f"{p} belongs to uid {st.st_uid}, not to you (uid {uid})"
    if mode & 0o022:
        return f"{p} has mode {mode:o}: others may write to it"
    for parent in p.parents:
        st = os.stat(parent)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (uid, 0):
            return f"{parent} (above {p}) belongs to uid {st.st_uid}, neither you (uid {uid}) nor root"
        if mode & 0o022 and not mode & stat.S_ISVTX:
            return f"{parent} (above {p}) has mode {mode:o}: others may rename what is in it"
    return None


def trusted_folder(path: str | os.PathLike, what: str) -> Path:
    """path, made (0700) if missing, refused with UntrustedFolder naming why and the fix unless
    untrusted_folder() finds nothing wrong."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True, mode=0o700)
    why = untrusted_folder(p)
    if why:
        raise UntrustedFolder(f"{what} {p}: {why}; another user could rename or replace what the lab "
                              f"writes there. Move it aside (or `chown` it to you and `chmod go-w` it, "
                              f"and the folders above it) and try again")
    return p

