"""The run registry: what ran where, with which inputs, and how it ended.

An SQLite database in WAL mode (logs/registry.sqlite): the CLI, cron firings and the web page write
it concurrently without corrupting it, and a process killed mid-write loses only its own
transaction. It is a cache of the hosts' run directories (the hosts are the source of truth):
`sync_host` rewrites it from a host's report, and a lost registry is rebuilt the same way.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sqlite3
import sys
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from eaglelab.errors import RegistryError
from eaglelab.fsutil import parse_iso, utcnow_iso
from eaglelab.host.settle import state_of, vanished
from eaglelab.model import ACTIVE, FINAL, RUN_FIELDS, Run, RunState

# the run record's fields (eaglelab.model.Run), when written, and as of when (see supersedes): as_of by
# this machine's clock, host_seq by the host's own (its boot and monotonic clock: hostside.host_seq)
COLUMNS = (*RUN_FIELDS, "updated_at", "as_of", "host_seq")
STAMPS = ("updated_at", "as_of", "host_seq")  # when a row was heard, not what it says


def _column_type(tp: Any) -> str:
    """A run field's SQLite declaration, from its type in eaglelab.model.Run."""
    args = [a for a in get_args(tp) if a is not type(None)] or [tp]
    base = get_origin(args[0]) or args[0]
    if base is bool:
        return "INTEGER DEFAULT 0"
    return {int: "INTEGER", float: "REAL"}.get(base, "TEXT")  # str, RunState; dict as JSON text


_HINTS = get_type_hints(Run)
_KEYS = {"id": "TEXT PRIMARY KEY", "stage": "TEXT NOT NULL", "host": "TEXT NOT NULL", "state": "TEXT NOT NULL"}
RUN_COLUMNS = ({c: _KEYS.get(c) or _column_type(_HINTS[c]) for c in RUN_FIELDS}
               | {"updated_at": "TEXT", "as_of": "REAL", "host_seq": "TEXT"})
# columns that a registry made by an older release may lack: every one but the keys (ALTER TABLE adds them)
ADDED_COLUMNS = {c: decl for c, decl in RUN_COLUMNS.items() if c not in _KEYS}
JSON_COLUMNS = tuple(c for c in RUN_FIELDS if (get_origin(_HINTS[c]) in (Union, types.UnionType)
                                                and any(get_origin(a) is dict for a in get_args(_HINTS[c]))))
BOOL_COLUMNS = tuple(c for c in RUN_FIELDS if _HINTS[c] is bool)

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
  {", ".join(f"{c} {decl}" for c, decl in RUN_COLUMNS.items())}
);
CREATE INDEX IF NOT EXISTS runs_stage ON runs(stage, started_at);
CREATE TABLE IF NOT EXISTS hosts (
  name TEXT PRIMARY KEY, reachable INTEGER, unreachable_since TEXT, checked_at TEXT, report TEXT
);
CREATE TABLE IF NOT EXISTS phases (
  run_id TEXT NOT NULL, stage TEXT NOT NULL, host TEXT NOT NULL, profile TEXT, phase TEXT NOT NULL,
  duration_s REAL, items REAL, rate_s_per_item REAL, ended_at TEXT,
  PRIMARY KEY (run_id, phase)
);
CREATE TABLE IF NOT EXISTS input_sizes (
  stage TEXT NOT NULL, profile TEXT NOT NULL, host TEXT, path TEXT, unit TEXT, size REAL, how TEXT,
  reason TEXT, measured_at TEXT, PRIMARY KEY (stage, profile)
);
CREATE TABLE IF NOT EXISTS run_units (
  run_id TEXT PRIMARY KEY, stage TEXT NOT NULL, host TEXT, profile TEXT, unit TEXT, units REAL NOT NULL,
  how TEXT, recorded_at TEXT
);
"""


def describe_error(path: Path, e: sqlite3.Error) -> str:
    """What went wrong with the registry, and the fix for that cause: a full disk, a read-only
    folder or an I/O error is not a broken registry, and must not be answered by throwing it away."""
    text = str(e).lower()
    where = f"{path}: {e}"
    try:
        read_only_fs = bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        read_only_fs = False
    if read_only_fs or "readonly" in text or "read-only" in text:
        return (f"{where}: the registry or its folder is read-only for this user; make {path.parent} "
                f"writable (or set logs_dir in conf/lab.yaml to a writable folder)")
    if "full" in text:
        return f"{where}: the disk that holds it is full; free space there (`df -h {path.parent}`) and run again"
    if "disk i/o" in text:
        return f"{where}: an I/O error from the disk or filesystem, not a damaged registry; check `dmesg`"
    if "unable to open" in text:
        return f"{where}: cannot open it; check that {path.parent} exists and is writable for this user"
    if "locked" in text:
        return f"{where}: another lab process has held the write lock for over a minute; try again"
    return (f"{where}: not a usable registry; move it aside and run `lab status` to rebuild it from "
            f"the hosts' run directories (nothing on the hosts is lost)")


class Registry:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        # Callbacks given [(run as the registry knew it or None, run as now reported)] after each
        # write; notify.py uses this to see runs change state.
        self.observers: list[Callable[[list[tuple[dict | None, dict]]], None]] = []
        # The live runs (pending/running) this process has read or written, as stored: what a registry
        # deleted under it is rebuilt with, so that their ends are still news (see _rebuild_in_place).
        self._live: dict[str, dict] = {}
        self._ino: int | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not self.path.exists():  # made under the rebuild's lock, without a deleted one's -wal
                self._rebuild_in_place(quiet=True)
            self._ino = os.stat(self.path).st_ino
            with self._connect() as db:
                ensure_schema(db, SCHEMA, {"runs": ADDED_COLUMNS})
        except sqlite3.DatabaseError as e:
            raise RegistryError(describe_error(self.path, e)) from None

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            self._same_file()
            with self._open() as db:
                yield db
        except sqlite3.OperationalError as e:  # read-only, full, I/O: say which, never a traceback
            raise RegistryError(describe_error(self.path, e)) from None

    def _same_file(self) -> None:
        """The registry file this process opened is still the one at its path; else (deleted, or
        replaced by another process's rebuild) it is rebuilt in place before anything is read."""
        try:
            ino = os.stat(self.path).st_ino
        except FileNotFoundError:
            ino = None
        if ino is None or ino != self._ino:
            self._rebuild_in_place()

    def _rebuild_in_place(self, quiet: bool = False) -> None:
        """The registry was deleted (or replaced) under this process: make it again where it was, with
        its tables and the live runs this process knew (as they were stored: an end heard next is a
        transition, so its webhook goes out), and carry on; the hosts' next reports fill in the rest,
        as they rebuild a registry deleted while nothing ran. One process at a time (a lock beside it):
        a -wal or -shm left by the deleted file is removed only while no registry file exists, so it
        cannot be replayed into the new one, and never one that a new file already uses."""
        try:
            lock = os.open(self.path.with_name(self.path.name + ".rebuild.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:  # a read-only folder: opening the registry says what is wrong
            lock = os.open(os.devnull, os.O_RDONLY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            made = not self.path.exists()
            if made:  # private: it holds commands, paths and the webhooks' outbox
                for tail in ("-wal", "-shm", "-journal"):
                    Path(f"{self.path}{tail}").unlink(missing_ok=True)
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
            with self._open() as db:
                ensure_schema(db, SCHEMA, {"runs": ADDED_COLUMNS})
                cols = ", ".join(COLUMNS)
                marks = ", ".join(f":{c}" for c in COLUMNS)
                db.execute("BEGIN IMMEDIATE")
                db.executemany(f"INSERT OR IGNORE INTO runs ({cols}) VALUES ({marks})",
                               [_encoded({c: row.get(c) for c in COLUMNS}) for row in self._live.values()])
                db.execute("COMMIT")
            self._ino = os.stat(self.path).st_ino
        finally:
            os.close(lock)
        if not quiet:
            print(f"lab: the registry {self.path} was {'deleted' if made else 'replaced'} under this process; "
                  f"rebuilt in place ({len(self._live)} live run(s) kept from memory; the hosts' reports fill "
                  f"in the rest)", file=sys.stderr)

    def _remember(self, rows: list[dict]) -> None:
        for row in rows:
            if row.get("state") in ACTIVE:
                self._live[row["id"]] = row
            else:
                self._live.pop(row.get("id"), None)

    @contextmanager
    def _open(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout=60000")
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":  # persistent: set once
                _retry_locked(lambda: db.execute("PRAGMA journal_mode=WAL"))
            db.execute("PRAGMA synchronous=NORMAL")
            db.row_factory = sqlite3.Row
            yield db
        finally:
            db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")  # take the write lock up front: no upgrade deadlocks
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                # A signal (SystemExit from a handler) can land after COMMIT already went through:
                # roll back only what is still open, and let the original exception through.
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def upsert(self, run: dict, as_of: float | None = None) -> None:
        self.upsert_many([run], as_of)

    def upsert_many(self, runs: list[dict], as_of: float | None = None) -> None:
        """Write runs as a host reported them at `as_of` (this machine's clock when the report was
        asked for; default now) and `host_seq` (each run's own, the host's clock: it decides). A row
        that would move a run backwards is left as stored: see supersedes. Observers hear of the
        rows written only."""
        now = utcnow_iso()
        as_of = time.time() if as_of is None else as_of
        rows = []
        for r in runs:
            row = {c: r.get(c) for c in COLUMNS}
            row["id"] = r.get("id") or r.get("run_id")
            row.update({c: int(bool(r.get(c))) for c in BOOL_COLUMNS})  # lost, orphaned, stop_requested ...
            row["updated_at"] = now
            row["as_of"] = as_of
            row["state"] = state_of(row)  # the host's answer; settle's for a row that carries none
            rows.append((r, row))
        cols = ", ".join(COLUMNS)
        marks = ", ".join(f":{c}" for c in COLUMNS)
        updates = ", ".join(f"{c}=excluded.{c}" for c in COLUMNS if c != "id")
        with self._tx() as db:
            # What the registry knew before, read under the write lock: of several processes
            # syncing the same change, exactly one writes (and its observers see) the transition.
            before = self._stored(db, [row["id"] for _, row in rows])
            ok = [(r, row) for r, row in rows if supersedes(before.get(row["id"]), row)]
            kept = [(r, row) for r, row in ok if not _same_end(before.get(row["id"]), row)]
            db.executemany(f"INSERT INTO runs ({cols}) VALUES ({marks}) ON CONFLICT(id) DO UPDATE SET {updates}",
                           [_encoded(row) for _, row in kept])
            # the same end heard again is still news as of then: a report asked for earlier stays older
            written = {row["id"] for _, row in kept}
            db.executemany("UPDATE runs SET as_of = ?, updated_at = ?, host_seq = COALESCE(?, host_seq) WHERE id = ?",
                           [(row["as_of"], row["updated_at"], row["host_seq"], row["id"])
                            for _, row in ok if row["id"] not in written])
        self._remember([row if row["id"] in written else before[row["id"]]
                        for _, row in rows if row["id"] in written or row["id"] in before])
        if self.observers and kept:
            changes = [(before.get(row["id"]), {**r, "id": row["id"], "state": row["state"]}) for r, row in kept]
            for observe in self.observers:
                try:
                    observe(changes)
                except Exception as e:  # noqa: BLE001 - an observer never breaks the registry
                    print(f"lab: registry observer failed: {type(e).__name__}: {e}", file=sys.stderr)

    @staticmethod
    def _stored(db: sqlite3.Connection, ids: list[str]) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for i in range(0, len(ids), 500):  # SQLite's bound-parameter limit
            chunk = ids[i:i + 500]
            marks = ", ".join("?" * len(chunk))
            for known in db.execute(f"SELECT * FROM runs WHERE id IN ({marks})", chunk):
                out[known["id"]] = _row(known)
        return out

    def get(self, run_id: str) -> dict | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        self._remember([out := _row(row)])
        return out

    def runs(self, stage: str | None = None, host: str | None = None, limit: int | None = None) -> list[dict]:
        sql, args = "SELECT * FROM runs WHERE 1=1", []
        if stage:
            sql += " AND stage = ?"
            args.append(stage)
        if host:
            sql += " AND host = ?"
            args.append(host)
        sql += " ORDER BY started_at IS NULL, started_at, id"
        with self._connect() as db:
            rows = [_row(r) for r in db.execute(sql, args)]
        self._remember(rows)
        return rows[-limit:] if limit else rows

    def latest(self, stage: str) -> dict | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE stage = ? ORDER BY COALESCE(started_at, updated_at) DESC, "
                             "id DESC LIMIT 1", (stage,)).fetchone()
        if row is None:
            return None
        self._remember([out := _row(row)])
        return out

    def sync_host(self, host: str, report: dict | None, error: str | None = None,
                  as_of: float | None = None) -> None:
        """Record a host's report (its runs are the truth) or that it did not answer. as_of: when
        the report was asked for (a slow answer written late must not undo a newer one)."""
        now = utcnow_iso()
        if report is not None:
            self.upsert_many(report.get("runs", []), as_of)
            self.record_phases_from_runs(report.get("runs", []))
        with self._tx() as db:
            prev = db.execute("SELECT * FROM hosts WHERE name = ?", (host,)).fetchone()
            if report is not None:
                db.execute("INSERT OR REPLACE INTO hosts VALUES (?, 1, NULL, ?, ?)",
                           (host, now, json.dumps({k: v for k, v in report.items() if k != "runs"})))
            else:
                since = prev["unreachable_since"] if prev and not prev["reachable"] else now
                db.execute("INSERT OR REPLACE INTO hosts VALUES (?, 0, ?, ?, ?)",
                           (host, since, prev["checked_at"] if prev else None,
                            json.dumps({"error": error, **(json.loads(prev["report"]) if prev and prev["report"]
                                                           else {})})))

    def missing_from(self, host: str, report: dict, stage: str | None, asked_at: float) -> list[tuple[dict, str]]:
        """The live runs (pending/running) the registry has on `host` that the host's report, asked
        for at `asked_at`, lacks although their directory is in the folder it read (`runs_dir`): the
        directory vanished, or is listed in `bad_runs` (unreadable). [(row, why)]. Rows written after
        the report was asked for (a launch a moment ago) are not judged by it: by the host's clock
        when both carry it (`host_seq`), else by this machine's."""
        root = report.get("runs_dir")
        if not root:
            return []  # an older host: it does not say what it read
        ids = {r.get("id") for r in report.get("runs") or []}
        bad = {b.get("run_dir"): b.get("error") for b in report.get("bad_runs") or [] if isinstance(b, dict)}
        sql, args = "SELECT * FROM runs WHERE host = ? AND state IN (?, ?)", [host, *sorted(ACTIVE)]
        if stage:
            sql, args = sql + " AND stage = ?", [*args, stage]
        with self._connect() as db:
            live = [_row(r) for r in db.execute(sql, args)]
        out = []
        for row in live:
            if row["id"] in ids or not row.get("run_dir"):
                continue
            if str(Path(row["run_dir"]).parent) != root:
                continue
            seen, read = _seq(row.get("host_seq")), _seq(report.get("host_seq"))
            if (seen[1] > read[1] if seen and read and seen[0] == read[0] else (row.get("as_of") or 0) > asked_at):
                continue
            why = bad.get(row["run_dir"]) or f"its run directory {row['run_dir']} is gone"
            out.append((row, why))
        return out

    def end_missing(self, host: str, missing: list[tuple[dict, str]]) -> None:
        """End runs the host confirmed it no longer has (missing_from, asked twice): `killed`, `lost`,
        the reason in `end_unknown` (so it is not run again unasked: `lab run STAGE --force`)."""
        now = utcnow_iso()
        rows = [vanished(row, f"host {host} no longer reports it: {why}", now) for row, why in missing]
        if rows:
            self.upsert_many(rows)

    def hosts(self) -> dict[str, dict]:
        with self._connect() as db:
            out = {}
            for r in db.execute("SELECT * FROM hosts"):
                # the stored report first: its own keys must not override what the registry knows now
                out[r["name"]] = {**(json.loads(r["report"]) if r["report"] else {}),
                                  "name": r["name"], "reachable": bool(r["reachable"]),
                                  "unreachable_since": r["unreachable_since"], "checked_at": r["checked_at"]}
        return out

    # -- phase history, for the ETA of phases not yet begun ------------------------------------

    def record_phases_from_runs(self, runs: list[dict]) -> None:
        """The durations a completed run teaches the ETA history: its phases and the whole run, as
        work. The time its process spent stopped (SIGSTOP, Ctrl-Z: exit.json's `stopped`) is no
        work: it is taken out of the run and of each phase it fell in (by their times on the host);
        a phase of a paused run that has no times to place the pause in is not learned from."""
        rows = []
        for r in runs:
            ls = r.get("log_state") or {}
            if r.get("state") != RunState.COMPLETED:
                continue
            stopped = r.get("stopped") if isinstance(r.get("stopped"), dict) else {}
            pauses = [(a, b) for a, b in (tuple(map(parse_iso, iv)) for iv in stopped.get("intervals") or []
                                          if isinstance(iv, list) and len(iv) == 2) if a and b]
            for p in ls.get("phases") or []:
                if p.get("duration_s") is None or not p.get("name"):
                    continue
                duration, rate = p["duration_s"], p.get("rate_s_per_item")
                if pauses:
                    start, end = parse_iso(p.get("started_at")), parse_iso(p.get("ended_at"))
                    if start is None or end is None:
                        continue
                    paused = sum(max(0.0, min(end, b) - max(start, a)) for a, b in pauses)
                    if paused:
                        duration = round(max(duration - paused, 0.0), 3)
                        rate = duration / p["items"] if rate is not None and p.get("items") else rate
                rows.append((r.get("id"), r.get("stage"), r.get("host"), r.get("profile"), p["name"],
                             duration, p.get("items"), rate, r.get("ended_at")))
            if r.get("duration_s") is not None:
                work = max(r["duration_s"] - float(stopped.get("total_s") or 0.0), 0.0)
                rows.append((r.get("id"), r.get("stage"), r.get("host"), r.get("profile"), "__run__",
                             round(work, 3), None, None, r.get("ended_at")))
        if rows:
            with self._tx() as db:
                db.executemany("INSERT OR REPLACE INTO phases VALUES (?,?,?,?,?,?,?,?,?)", rows)

    def phase_history(self, stage: str | None = None) -> list[dict]:
        sql = "SELECT * FROM phases" + (" WHERE stage = ?" if stage else "") + " ORDER BY ended_at"
        with self._connect() as db:
            return [dict(r) for r in db.execute(sql, (stage,) if stage else ())]


    # -- input sizes, for first-run priors (eaglelab.control.priors) -----------------------------

    def record_input_sizes(self, rows: list[dict]) -> None:
        """The latest measurement of each stage's input ({stage, profile, host, path, unit, size,
        how, reason}), so a page that does not ask the hosts still has it."""
        if rows:
            with self._tx() as db:
                db.executemany("INSERT OR REPLACE INTO input_sizes VALUES (?,?,?,?,?,?,?,?,?)",
                               [(r["stage"], r["profile"], r.get("host"), r.get("path"), r.get("unit"), r.get("size"),
                                 r.get("how"), r.get("reason"), utcnow_iso()) for r in rows])

    def input_sizes(self, profile: str) -> dict[str, dict]:
        with self._connect() as db:
            return {r["stage"]: dict(r) for r in db.execute("SELECT * FROM input_sizes WHERE profile = ?", (profile,))}

    def record_run_units(self, rows: list[dict]) -> None:
        """The size a finished run worked on ({run_id, stage, host, profile, unit, units, how}); the
        first record of a run stays (its input may change later)."""
        if rows:
            with self._tx() as db:
                db.executemany("INSERT OR IGNORE INTO run_units VALUES (?,?,?,?,?,?,?,?)",
                               [(r["run_id"], r["stage"], r.get("host"), r.get("profile"), r.get("unit"),
                                 r["units"], r.get("how"), utcnow_iso()) for r in rows])

    def run_units(self) -> list[dict]:
        with self._connect() as db:
            return [dict(r) for r in db.execute("SELECT * FROM run_units ORDER BY recorded_at")]


def supersedes(stored: dict | None, incoming: dict) -> bool:
    """Whether a report's row may replace the stored one. Several processes (the CLI following a
    run, the page's refresher, cron) poll the same host and write what they heard in whatever
    order their round trips end, so:
      - an ended run (completed, failed, killed) is never set back to pending/running: that row is
        a stale report, written late. The one exception is a new attempt of a requeued Slurm job
        (its restart_count or its host-counted `attempts` grew), which really runs again;
      - a row from a report read before the stored one's is older news and is left out, unless it
        is the run's end over a stored active state (an end is news in any order). "Before" is the
        host's own order (`host_seq`: its boot and monotonic clock, stamped where the run was read),
        never a wall clock: one report from a controller two hours ahead, or a wall clock stepped
        back, would otherwise freeze every live run's progress until the clock caught up. A row the
        host stamped replaces an unstamped one (a launch record) and is never replaced by one;
        only between unstamped rows (a host of an older release) does this machine's `as_of` decide.
    """
    if stored is None:
        return True
    old, new = stored.get("state"), incoming.get("state")
    if old in FINAL and new in ACTIVE:
        return _restarts(incoming) > _restarts(stored)
    if old in ACTIVE and new in FINAL:
        return True
    seen, heard = _seq(stored.get("host_seq")), _seq(incoming.get("host_seq"))
    if seen and heard:  # another boot: the host rebooted since the stored row was read, so this is later
        return heard[0] != seen[0] or heard[1] >= seen[1]
    if seen or heard:
        return heard is not None
    stored_at, asked_at = stored.get("as_of"), incoming.get("as_of")
    return stored_at is None or asked_at is None or asked_at >= stored_at


def _seq(stamp: Any) -> tuple[str, int] | None:
    """(boot id, monotonic ns) from a host_seq stamp (hostside.host_seq), None when absent or malformed."""
    if not isinstance(stamp, str):
        return None
    boot, _, ns = stamp.rpartition(":")
    return (boot, int(ns)) if boot and ns.isdigit() else None


def _same_end(stored: dict | None, row: dict) -> bool:
    """An ended run reported again exactly as stored: nothing to write (a refresh of a host with 50
    finished runs rewrote 50 rows of JSON, ~40% of `lab status`'s own CPU) and nothing to observe."""
    return (stored is not None and stored.get("state") in FINAL
            and all(stored.get(c) == row.get(c) for c in COLUMNS if c not in STAMPS))


def _encoded(row: dict) -> dict:
    return {**row, **{c: json.dumps(row[c]) if row[c] is not None else None for c in JSON_COLUMNS}}


def _restarts(run: dict) -> int:
    slurm = run.get("slurm")
    if isinstance(slurm, str):  # a row as written (JSON text)
        try:
            slurm = json.loads(slurm)
        except ValueError:
            slurm = None
    count = slurm.get("restart_count") if isinstance(slurm, dict) else None
    starts = run.get("attempts")  # counted on the host: a requeue Slurm did not count (restart 0) too
    return max(count if isinstance(count, int) else 0, starts - 1 if isinstance(starts, int) else 0)


def ensure_schema(db: sqlite3.Connection, schema: str, added_columns: dict[str, dict[str, str]] | None = None) -> None:
    """Create the tables/indexes of `schema` (and columns added since) that are missing.

    Nothing is written when all exist, so readers never queue for the write lock. When something
    is missing it is made under BEGIN IMMEDIATE, which waits its turn (busy_timeout): a bare
    CREATE in autocommit can fail at once with "database is locked" next to a busy writer."""
    added_columns = added_columns or {}
    statements = [st.strip() for st in schema.split(";") if st.strip()]
    wanted = {re.search(r"IF NOT EXISTS (\w+)", st).group(1) for st in statements}

    def missing_parts(conn) -> bool:
        have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if not wanted <= have:
            return True
        for table, cols in added_columns.items():
            if set(cols) - {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
                return True
        return False

    def create() -> None:
        if not missing_parts(db):
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            for st in statements:
                db.execute(st)
            for table, cols in added_columns.items():  # registries made before these columns existed
                have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
                for col, decl in cols.items():
                    if col not in have:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {col} {decl}")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    _retry_locked(create)


def _retry_locked(fn, attempts: int = 100, pause_s: float = 0.1):
    """fn(), again while SQLite says the database is locked (WAL recovery after a writer was
    killed, a schema change next to a reader): such waits are short and the busy handler does
    not cover every one of them."""
    for i in range(attempts):
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or i == attempts - 1:
                raise
            time.sleep(pause_s)


def _row(row: sqlite3.Row) -> dict:
    d = dict(row)
    d.update({c: bool(d.get(c)) for c in BOOL_COLUMNS})
    d.update({c: json.loads(d[c]) if d.get(c) else None for c in JSON_COLUMNS})
    return d

