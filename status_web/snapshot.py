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
from collections.abc import Callable
from pathlib import Path

from eaglelab.fsutil import utcnow_iso

GZIP_LEVEL = 6  # status JSON is repetitive: level 6 is ~60x smaller than raw, level 1 only ~15x
MAX_SLOW_SHARE = 1 / 3  # a refresh that takes t seconds waits at least 2t: the refresher uses <= 1/3 of a core


class Snap:
    """One refresh's result, immutable once published. `status` is parsed from `body` on first use
    when the Snap came from the refresher process (the hot routes never need it).

    No lock here is ever held while foreign code runs: a page's build reads `status` (and may read
    other cached keys), so `cached` only books the key under the lock and builds outside it; the
    other askers of the same key wait for that one build."""

    WAIT_S = 30.0  # an asker waits this long for another thread's build, then builds its own copy

    def __init__(self, version: int, status: dict | None, body: bytes, body_gz: bytes, etag: str,
                 refreshed_at: float, cache: dict | None = None):
        self.version, self.body, self.body_gz, self.etag, self.refreshed_at = version, body, body_gz, etag, refreshed_at
        self._status = status
        self.cache: dict = cache if cache is not None else {}  # rendered responses: key -> (raw, gzipped)
        self._lock = threading.Lock()  # guards _building only, never held across a build or a parse
        self._building: dict = {}  # key -> Event set when its build ends

    @property
    def status(self) -> dict:
        if self._status is None:
            # two first readers may both parse: same result, and no lock to wait behind
            self._status = json.loads(self.body)
        return self._status

    def cached(self, key, build: Callable[[], bytes]) -> tuple[bytes, bytes]:
        """(raw, gzipped) for key, built once per snapshot however many requests ask at once."""
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        with self._lock:
            hit = self.cache.get(key)
            done = self._building.get(key) if hit is None else None
            mine = hit is None and done is None
            if mine:
                done = self._building[key] = threading.Event()
        if hit is not None:
            return hit
        if not mine:
            done.wait(self.WAIT_S)
            hit = self.cache.get(key)
            if hit is not None:
                return hit
            return self._build(build)  # that build failed (or is stuck): our own, not cached
        try:
            hit = self._build(build)
            if len(self.cache) < 512:
                self.cache[key] = hit
            return hit
        finally:
            with self._lock:
                self._building.pop(key, None)
            done.set()

    @staticmethod
    def _build(build: Callable[[], bytes]) -> tuple[bytes, bytes]:
        raw = build()
        return raw, gzip.compress(raw, GZIP_LEVEL, mtime=0)


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
                status = dict(prev.status)  # the previous one, marked with the error below
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

    def start(self) -> Snapshot:
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


# -- the refresh in a process of its own ------------------------------------------------------------
# Measured (bench/bench_web.py, 50 hosts x 8 stages, 2 cores): with the refresh in a thread of the
# serving process, /api/status p99 was ~125 ms: collect() and json/gzip/render hold the GIL for
# ~1 s per refresh and every request waits behind them. In a child process: ~20 ms.

class ProcessSnapshot:
    """Snapshot's interface; the refresh (collect, JSON, gzip, pre-rendered pages) runs in a child
    process, `child_main(conn, child_args, interval_s)` (the app's own: it builds the same app and
    calls serve_refreshes), which sends back only bytes. Taking it as an argument keeps this module
    free of the app it serves."""

    def __init__(self, child_main: Callable, child_args: dict, interval_s: float):
        import multiprocessing as mp
        self.interval_s = interval_s
        self.warmers: list = []  # the child pre-renders
        self._snap: Snap | None = None
        self._error: str | None = None
        self._fresh = threading.Condition()
        ctx = mp.get_context("spawn")  # never fork a process that has threads
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=child_main, args=(child_conn, child_args, interval_s),
                                 name="eaglelab-web-refresh", daemon=True)
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def current(self) -> Snap | None:
        return self._snap

    @property
    def error(self) -> str | None:
        return self._error

    def start(self) -> ProcessSnapshot:
        if self._thread is None:
            self._proc.start()
            self._thread = threading.Thread(target=self._receive, name="status-receive", daemon=True)
            self._thread.start()
        return self

    def _receive(self) -> None:
        version = 0
        while not self._stopped:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                if not self._stopped:
                    self._error = "the status refresher process ended; restart `lab web`"
                return
            version += 1
            snap = Snap(version, None, msg["body"], msg["body_gz"], msg["etag"], msg["refreshed_at"], msg["cache"])
            with self._fresh:
                self._error = msg["error"]
                self._snap = snap
                self._fresh.notify_all()

    def refresh_now(self, timeout: float = 60.0) -> Snap | None:
        """Ask for a refresh and wait for it (tests, and the first page)."""
        self.start()
        with self._fresh:
            before = self._snap
            self.poke()
            self._fresh.wait_for(lambda: self._snap is not before, timeout)
        return self._snap

    def poke(self) -> None:
        try:
            self._conn.send("refresh")
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        self._stopped = True
        try:
            self._conn.send("stop")
        except (OSError, ValueError):
            pass
        if self._proc.is_alive():
            self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.terminate()


def serve_refreshes(conn, snapshot: Snapshot, interval_s: float) -> None:
    """The refresher process's loop: refresh in-thread, send each Snap as bytes, until "stop"."""
    while True:
        snap = snapshot.refresh_now()
        if snap is not None:
            conn.send({"body": snap.body, "body_gz": snap.body_gz, "etag": snap.etag,
                       "refreshed_at": snap.refreshed_at, "cache": dict(snap.cache), "error": snapshot.error})
        wait = max(interval_s, snapshot.last_took_s / MAX_SLOW_SHARE - snapshot.last_took_s)
        if conn.poll(wait):
            try:
                if conn.recv() == "stop":
                    return
            except EOFError:
                return
            while conn.poll(0):  # several pokes: one refresh
                if conn.recv() == "stop":
                    return
