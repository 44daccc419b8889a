"""The lab's status, refreshed in the background: collect() asks the hosts (an ssh round trip each),
requests never do. Each refresh builds one immutable Snap (the dict, its JSON bytes, an ETag) and
swaps it in, so a request only reads a reference: /api/status costs the same with 1 host or 50.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from eaglelab.fsutil import utcnow_iso


GZIP_LEVEL = 6  # status JSON is repetitive: level 6 is ~60x smaller than raw, level 1 only ~15x
MAX_SLOW_SHARE = 1 / 3  # a refresh that takes t seconds waits at least 2t: the refresher uses <= 1/3 of a core


@dataclass(frozen=True)
class Snap:
    version: int
    status: dict
    body: bytes  # /api/status, serialized once per refresh
    body_gz: bytes
    etag: str
    refreshed_at: float
    cache: dict = field(default_factory=dict)  # rendered responses of this version: key -> (raw, gzipped)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one render per key, not one per request

    def cached(self, key, build: Callable[[], bytes]) -> tuple[bytes, bytes]:
        """(raw, gzipped) for key, built once per snapshot however many requests ask at once."""
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        with self.lock:
            hit = self.cache.get(key)
            if hit is None:
                raw = build()
                hit = (raw, gzip.compress(raw, GZIP_LEVEL, mtime=0))
                if len(self.cache) < 512:
                    self.cache[key] = hit
            return hit


class Snapshot:
    """Holds the latest Snap; a daemon thread replaces it every interval_s (sooner when poked)."""

    def __init__(self, source: Callable[[], dict], interval_s: float = 2.0,
                 local_hosts: Callable[[], set[str]] = set, clock: Callable[[], float] = time.time):
        self.source, self.interval_s, self.local_hosts, self.clock = source, interval_s, local_hosts, clock
        self.warmers: list[Callable[[Snap], None]] = []  # pre-render hot pages before a Snap is published
        self.last_took_s = 0.0
        self._snap: Snap | None = None
        self._error: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def current(self) -> Snap | None:
        return self._snap

    @property
    def error(self) -> str | None:
        return self._error

    def refresh_now(self) -> Snap | None:
        """One collect() and swap (serialized: the thread and a caller never collect at once)."""
        with self._lock:
            started = self.clock()
            try:
                status = self.source()
                self._error = None
            except Exception as e:  # noqa: BLE001 - keep serving the last good snapshot, say why
                self._error = f"{type(e).__name__}: {e}"[:500]
                status = None
            prev = self._snap
            if status is None:
                if prev is None:
                    return None
                status = dict(prev.status)
            else:
                mark_state_files(status, self.local_hosts())
            now = self.clock()
            status["web"] = {"refreshed_at": utcnow_iso(now), "refresh_took_s": round(now - started, 3),
                             "refresh_every_s": self.interval_s, "refresh_error": self._error}
            body = json.dumps(status, separators=(",", ":"), default=str).encode()
            version = (prev.version + 1) if prev else 1
            snap = Snap(version, status, body, gzip.compress(body, GZIP_LEVEL, mtime=0),
                        '"' + hashlib.blake2s(body, digest_size=8).hexdigest() + '"', now)
            for warm in self.warmers:
                try:
                    warm(snap)
                except Exception:  # noqa: BLE001 - a page that fails to pre-render renders on request
                    pass
            self._snap = snap
            self.last_took_s = self.clock() - started
            return snap

    def start(self) -> "Snapshot":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="status-refresh", daemon=True)
            self._thread.start()
        return self

    def poke(self) -> None:
        """Refresh soon (after an action changed something)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.refresh_now()
            self._wake.wait(max(self.interval_s, self.last_took_s / MAX_SLOW_SHARE - self.last_took_s))
            self._wake.clear()


def mark_state_files(status: dict, local_hosts: set[str]) -> None:
    """runs[*].log_state_status: ok | missing | unreadable | not_json_object, for runs whose
    directory is on this machine (elsewhere only `ok` or null can be told from the report)."""
    for r in status.get("runs") or []:
        if not isinstance(r, dict):
            continue
        if r.get("log_state") is not None:
            r["log_state_status"] = "ok" if isinstance(r["log_state"], dict) else "not_json_object"
            continue
        r["log_state_status"] = None
        if r.get("host") in local_hosts and isinstance(r.get("run_dir"), str):
            # the path comes from the registry (written by our own launcher), never from a URL
            path = Path(r["run_dir"]) / "state.json"
            r["log_state_status"] = "unreadable" if path.exists() else "missing"
