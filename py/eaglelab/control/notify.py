"""Tell people when a stage completed, failed or stalled, and when a pipeline finished.

Where a transition is learnt: the registry (runs.Registry.upsert_many) reads what it knew of a run
under its write lock and hands (before, now) to its observers; `watch(lab)` adds ours. Of several
processes polling the same hosts (cron firing, `lab status`, the status page) exactly one sees a
given change, and the notifications table's key (`<run_id>:<event>`) makes a second claim a no-op.

Delivery never blocks the pipeline: events go into an outbox (tables in the registry DB), and a
detached drainer process (`python -m eaglelab.control.notify drain DB`) posts them with retries and
exponential backoff, one webhook at a time in order, different webhooks in parallel, so a webhook
that hangs delays nothing but its own messages. At most one drainer runs (a lock); whoever queues
a message starts one when none is running.

Bodies: `generic` (JSON, schema 1), `slack` ({"text", "blocks"}), `ntfy` (plain text + headers).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from eaglelab.config import webhook_url_problem
from eaglelab.control.registry import ensure_schema as _ensure
from eaglelab.figures import human_duration as _human
from eaglelab.fsutil import utcnow_iso
from eaglelab.host.settle import is_failure
from eaglelab.lab_status import read_run
from eaglelab.model import ACTIVE, Run, RunState, StageState, how_it_ended
from eaglelab.side_jobs import SMOKE_PREFIX  # smoke-<stage>: the next stage's smoke test (a side job)

EVENTS = ("completed", "failed", "stalled", "pipeline_finished", "gate_failed")
MAX_ATTEMPTS = 6
BACKOFF_S = 2.0  # 2, 4, 8, 16, 32 s between attempts: the last one about a minute after the first
TIMEOUT_S = 10.0  # per attempt (connect + answer)
EXPIRE_S = 24 * 3600.0  # undelivered after this long: given up

SCHEMA = """
CREATE TABLE IF NOT EXISTS notifications (
  key TEXT PRIMARY KEY, event TEXT NOT NULL, run_id TEXT, stage TEXT, host TEXT,
  created_at REAL NOT NULL, payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS notify_deliveries (
  key TEXT NOT NULL, url TEXT NOT NULL, format TEXT NOT NULL, body BLOB NOT NULL, headers TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'pending', attempts INTEGER NOT NULL DEFAULT 0, next_at REAL NOT NULL,
  created_at REAL NOT NULL, sent_at REAL, last_error TEXT,
  PRIMARY KEY (key, url)
);
CREATE INDEX IF NOT EXISTS notify_deliveries_state ON notify_deliveries(state, url, created_at);
"""


# -- what happened (pure) -----------------------------------------------------------------------

def run_of(record: Run | dict | None) -> Run | None:
    """The typed run of a registry record (what the registry's observers hand over; tests pass
    records too): a field of the wrong type reads as absent; None for no run (no known state)."""
    return record if isinstance(record, Run) or record is None else read_run(record)


def _log_state(run: Run) -> str | None:
    return run.log_state.get("state") if run.log_state else None


def events_for(before: Run | dict | None, now: Run | dict) -> list[str]:
    """The events a change of one run's record means. A run first seen already ended is history
    (a rebuilt registry, another controller's run), not news: no event."""
    before, now = run_of(before), run_of(now)
    if before is None or now is None:
        return []
    events = []
    if before.state in ACTIVE and now.state == RunState.COMPLETED:
        events.append("completed")
    elif before.state in ACTIVE and is_failure(now):  # failed, or lost: as eaglelab.host.settle decided it
        events.append("failed")
    if now.state in ACTIVE and _log_state(now) == StageState.STALLED and _log_state(before) != StageState.STALLED:
        events.append("stalled")
    return events


def failure_text(run: Run) -> str | None:
    """Why a run failed: the parser's diagnosis when there is one, else how the process ended."""
    return how_it_ended(run)


def stall_text(run: Run) -> str:
    """Why the tailer thinks a run is stuck (its `stall` diagnosis), or a plain default."""
    from eaglelab.logstate import LogState  # making its classes costs every `lab status` ~2 ms: only on a stall
    log = LogState.from_json(run.log_state)
    return (log.stall_message if log else "").strip() or "no progress in its log"


def human_duration(s: float | None) -> str:
    return _human(s) if s is not None else "?"


def stage_payload(event: str, run: Run | dict, status_url: str, now: float) -> dict:
    """The generic body of a stage event (schema 1), from the typed run; the other formats are made
    from it. Its fields are the run's as the registry stored them (docs/operations.md, "Notifications")."""
    run = run_of(run)
    reason = failure_text(run) if event == RunState.FAILED else stall_text(run) if event == StageState.STALLED else None
    stage, host, dur = run.stage, run.host, run.duration_s
    if event == RunState.COMPLETED:
        text = f"{stage} completed on {host} in {human_duration(dur)}"
    elif event == RunState.FAILED and str(stage).startswith(SMOKE_PREFIX):  # the next stage's failure, found early
        text = (f"{stage[len(SMOKE_PREFIX):]} will fail: its smoke test failed on {host} after "
                f"{human_duration(dur)}: {reason or run.state}")
    elif event == RunState.FAILED and stage == "engine_check" and "engine-path alarm" in (reason or ""):
        text = f"ENGINE-PATH ALARM on {host} while synth runs: {reason}"  # docs/foresight.md, "The engine check"
    elif event == RunState.FAILED:
        text = f"{stage} failed on {host} after {human_duration(dur)}: {reason or run.state}"
    else:
        text = f"{stage} stalled on {host} (running for {human_duration(dur)}): {reason}"
    return {"schema": 1, "event": event, "stage": stage, "host": host, "run_id": run.id,
            "state": run.state.value, "profile": run.profile, "duration_s": dur,
            "started_at": run.started_at, "ended_at": run.ended_at, "exit_code": run.exit_code, "signal": run.signal,
            "failure": (run.log_state or {}).get("failure"), "reason": reason, "status_url": status_url, "text": text,
            **({"smoke_of": stage[len(SMOKE_PREFIX):]} if str(stage).startswith(SMOKE_PREFIX) else {}),
            **({"alarm": "engine_path"} if text.startswith("ENGINE-PATH ALARM") else {}),
            "at": utcnow_iso(now)}


ICONS = {"completed": ("white_check_mark", "3"), "failed": ("x", "4"), "stalled": ("hourglass", "4"),
         "pipeline_finished": ("checkered_flag", "3"), "gate_failed": ("no_entry", "4")}


_MENTION = re.compile(r"@(?=(?:channel|here|everyone|all)\b)", re.IGNORECASE)


def mrkdwn(value) -> str:
    """Text from a log, a host or a path made inert in Slack mrkdwn: `&`, `<` and `>` escaped as
    Slack asks (so `<!channel>`, `<@U123>` and `<http://x|y>` links stay text), and `@channel` /
    `@here` broken with a zero-width space (Mattermost's mentions)."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MENTION.sub("@\u200b", text)


def render(fmt: str, payload: dict) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of one payload in one webhook format."""
    event, text, link = payload["event"], payload["text"], payload.get("status_url")
    icon, priority = ICONS.get(event, ("bell", "3"))
    if event == "pipeline_finished" and not payload.get("ok"):
        icon, priority = "x", "4"
    if fmt == "slack":  # every value is escaped (mrkdwn): a log line cannot ping the channel or add a link
        detail = [f":{icon}: *{mrkdwn(text)}*"]
        if payload.get("reason") and payload["reason"] not in text:
            detail.append(f"> {mrkdwn(payload['reason'])}")
        ctx = [f"host `{mrkdwn(payload.get('host'))}`"]
        if payload.get("run_id"):
            ctx.append(f"run `{mrkdwn(payload['run_id'])}`")
        if payload.get("log"):
            ctx.append(f"log `{mrkdwn(payload['log'])}`")
        if link:  # the lab's own status_url (config), escaped inside its link as Slack asks
            ctx.append(f"<{mrkdwn(link).replace('|', '%7C')}|status page>")
        body = {"text": f":{icon}: {mrkdwn(text)}",
                "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(detail)}},
                           {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(ctx)}]}]}
        return json.dumps(body).encode(), {"Content-Type": "application/json"}
    if fmt == "ntfy":
        lines = [text] + ([payload["reason"]] if payload.get("reason") and payload["reason"] not in text else [])
        headers = {"Content-Type": "text/plain; charset=utf-8", "Title": f"eaglelab: {event.replace('_', ' ')}",
                   "Tags": icon, "Priority": priority}
        if link:
            headers["Click"] = link
        return "\n".join(lines).encode(), headers
    return json.dumps(payload).encode(), {"Content-Type": "application/json"}


# -- the outbox ---------------------------------------------------------------------------------

def _db(path: str | os.PathLike) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), timeout=60, isolation_level=None)
    db.execute("PRAGMA busy_timeout=60000")
    db.row_factory = sqlite3.Row
    return db


def ensure_schema(db_path: str | os.PathLike) -> None:
    db = _db(db_path)
    try:
        _ensure(db, SCHEMA)
    finally:
        db.close()


def enqueue(db_path: str | os.PathLike, key: str, payload: dict, webhooks: list) -> bool:
    """Record one notification and its deliveries, once: False if key was already claimed."""
    now = time.time()
    db = _db(db_path)
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            cur = db.execute("INSERT OR IGNORE INTO notifications VALUES (?,?,?,?,?,?,?)",
                             (key, payload["event"], payload.get("run_id"), payload.get("stage"),
                              payload.get("host"), now, json.dumps(payload)))
            fresh = cur.rowcount == 1
            if fresh:
                for hook in webhooks:
                    if payload["event"] not in hook.events:
                        continue
                    body, headers = render(hook.format, payload)
                    db.execute("INSERT OR IGNORE INTO notify_deliveries (key, url, format, body, headers, next_at, "
                               "created_at) VALUES (?,?,?,?,?,?,?)",
                               (key, hook.resolved_url(), hook.format, body, json.dumps(headers), now, now))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    finally:
        db.close()
    return fresh


def deliveries(db_path: str | os.PathLike, limit: int = 50) -> list[dict]:
    """The latest deliveries with their state (for `lab notify log` and tests)."""
    ensure_schema(db_path)
    db = _db(db_path)
    try:
        rows = db.execute("SELECT d.key, d.url, d.format, d.state, d.attempts, d.last_error, d.created_at, "
                          "d.sent_at, n.event, n.stage, n.run_id FROM notify_deliveries d JOIN notifications n "
                          "USING (key) ORDER BY d.created_at DESC, d.rowid DESC LIMIT ?", (limit,)).fetchall()
    finally:
        db.close()
    return [{**dict(r), "url": redact_url(r["url"])} for r in rows]  # the outbox keeps it; screens never


# -- hooking into a Lab -------------------------------------------------------------------------

class Notifier:
    """Turns registry changes into queued notifications for the configured webhooks."""

    def __init__(self, db_path: Path, notify_cfg, locks_dir: Path, log_path: Path):
        self.db_path, self.cfg, self.locks_dir, self.log_path = Path(db_path), notify_cfg, locks_dir, log_path
        ensure_schema(self.db_path)

    def on_changes(self, changes: list[tuple[dict | None, dict]]) -> None:
        typed = [(run_of(before), run_of(run)) for before, run in changes]
        news = [(event, run) for before, run in typed for event in events_for(before, run)]
        if not news:
            return
        ensure_schema(self.db_path)  # the outbox again, if the registry was deleted and rebuilt in place
        queued = False
        for event, run in news:
            payload = stage_payload(event, run, self.cfg.status_url, time.time())
            queued |= enqueue(self.db_path, f"{run.id}:{event}", payload, self.cfg.webhooks)
        if queued:
            self.kick()

    def send(self, key: str, payload: dict) -> bool:
        ensure_schema(self.db_path)
        fresh = enqueue(self.db_path, key, payload, self.cfg.webhooks)
        if fresh:
            self.kick()
        return fresh

    def kick(self) -> None:
        kick_drainer(self.db_path, self.locks_dir, self.log_path)


def watch(lab) -> Notifier | None:
    """Notify on the lab's registry changes, when the config names webhooks."""
    cfg = lab.cfg.lab.notify
    if not cfg.webhooks:
        return None
    logs = lab.cfg.logs_dir
    n = Notifier(lab.registry.path, cfg, logs / "locks", logs / "notify.log")
    lab.registry.observers.append(n.on_changes)
    return n


def pipeline_finished(notifier: Notifier | None, *, firing_id: str, target: str, ok: bool, detail: str,
                      failed_stage: str | None, stages: list[dict], duration_s: float, log: str | None,
                      now: float | None = None) -> dict:
    """Queue the pipeline_finished event of one firing (no-op without webhooks); the payload."""
    now = now or time.time()
    host = socket.gethostname()
    text = (f"{target} finished on {host} in {human_duration(duration_s)}: {detail}" if ok else
            f"{target} stopped at {failed_stage} on {host} after {human_duration(duration_s)}: {detail}")
    payload = {"schema": 1, "event": "pipeline_finished", "target": target, "firing_id": firing_id, "ok": ok,
               "host": host, "failed_stage": failed_stage, "stages": stages, "duration_s": round(duration_s, 3),
               "reason": None if ok else detail, "log": log,
               "status_url": notifier.cfg.status_url if notifier else None, "text": text, "at": utcnow_iso(now)}
    if notifier is not None:
        notifier.send(f"pipeline:{firing_id}", payload)
    return payload


# -- delivery: one detached drainer at a time ---------------------------------------------------

def _try_lock(locks_dir: Path):
    from filelock import FileLock, Timeout
    locks_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(locks_dir / "notify-drain.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def kick_drainer(db_path: Path, locks_dir: Path, log_path: Path) -> None:
    """Start a drainer unless one runs. Rows are committed before this check, and a drainer looks
    for work again after releasing its lock, so nothing is left behind in between."""
    lock = _try_lock(locks_dir)
    if lock is None:
        return
    lock.release()
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as out:
        subprocess.Popen([sys.executable, "-m", "eaglelab.control.notify", "drain", str(db_path), str(locks_dir)],
                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                         start_new_session=True, close_fds=True)


class WebhookRefused(Exception):
    """A URL or an answer that a webhook post does not follow (not http(s), a redirect)."""


@functools.cache
def _opener():
    """urllib's opener for webhooks, made on the first post: urllib.request (ssl, http.client) takes
    ~10 ms to import, which every `lab` command that only watches the registry paid for nothing."""
    import urllib.request

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        """A webhook answers 2xx or fails: a redirect is never followed (it would send the message,
        or a GET carrying the secret path's answer, wherever the server points: another host, file:)."""

        def redirect_request(self, req, fp, code, msg, headers, newurl):
            raise WebhookRefused(f"HTTP {code} redirect not followed (webhooks must answer 2xx themselves)")

    return urllib.request.build_opener(NoRedirects, urllib.request.HTTPHandler, urllib.request.HTTPSHandler)


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = TIMEOUT_S) -> None:
    """One attempt; raises on a non-2xx answer, a redirect, a URL that is not http(s), or no answer."""
    import urllib.request  # see _opener

    problem = webhook_url_problem(url)
    if problem:
        raise WebhookRefused(problem)
    req = urllib.request.Request(url, data=body, headers={"User-Agent": "eaglelab-notify", **headers},
                                 method="POST")
    with _opener().open(req, timeout=timeout) as r:
        r.read(4096)


def redact_url(url: str) -> str:
    """A webhook URL for logs and screens: scheme and host, and a short hash to tell two apart.
    The path and query of a Slack/ntfy webhook are its secret."""
    try:
        parts = urlsplit(url)
        where = f"{parts.scheme}://{parts.hostname or '?'}{f':{parts.port}' if parts.port else ''}"
    except ValueError:
        where = "?"
    return f"{where}/…#{hashlib.sha256(url.encode()).hexdigest()[:8]}"


def _log(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} notify: {msg}", flush=True)


def _attempt(db_path: Path, row: dict) -> None:
    import urllib.error  # see _opener
    try:
        post(row["url"], row["body"], json.loads(row["headers"]))
        error = None
    except urllib.error.HTTPError as e:
        error = f"HTTP {e.code}"
    except WebhookRefused as e:  # the same answer next time: no retry
        error, row = f"refused: {e}", {**row, "attempts": MAX_ATTEMPTS - 1}
    except Exception as e:  # noqa: BLE001 - unreachable, refused, timeout, bad URL: all retried
        error = f"{type(e).__name__}: {getattr(e, 'reason', None) or e}"
    attempts = row["attempts"] + 1
    now = time.time()
    db = _db(db_path)
    try:
        if error is None:
            db.execute("UPDATE notify_deliveries SET state='sent', attempts=?, sent_at=?, last_error=NULL "
                       "WHERE key=? AND url=?", (attempts, now, row["key"], row["url"]))
            _log(f"sent {row['key']} to {redact_url(row['url'])} ({row['format']})")
        elif attempts >= MAX_ATTEMPTS:
            db.execute("UPDATE notify_deliveries SET state='failed', attempts=?, last_error=? WHERE key=? AND url=?",
                       (attempts, error, row["key"], row["url"]))
            _log(f"gave up on {row['key']} to {redact_url(row['url'])} after {attempts} attempts: {error}")
        else:
            delay = BACKOFF_S * 2 ** (attempts - 1)
            db.execute("UPDATE notify_deliveries SET attempts=?, last_error=?, next_at=? WHERE key=? AND url=?",
                       (attempts, error, now + delay, row["key"], row["url"]))
            _log(f"attempt {attempts} of {row['key']} to {redact_url(row['url'])} failed ({error}); next in {delay:.0f} s")
    finally:
        db.close()


def _drain_locked(db_path: Path) -> None:
    """Post pending deliveries until none is left: per webhook URL the oldest first (order kept),
    different URLs in parallel."""
    busy: dict[str, object] = {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        while True:
            busy = {u: f for u, f in busy.items() if not f.done()}
            db = _db(db_path)
            try:
                heads = db.execute("SELECT * FROM notify_deliveries WHERE state='pending' AND rowid IN "
                                   "(SELECT MIN(rowid) FROM notify_deliveries WHERE state='pending' GROUP BY url)"
                                   ).fetchall()
            finally:
                db.close()
            if not heads and not busy:
                return
            now = time.time()
            wake = now + 0.5
            for row in map(dict, heads):
                if row["url"] in busy:
                    continue
                if row["next_at"] <= now:
                    busy[row["url"]] = pool.submit(_attempt, db_path, row)
                else:
                    wake = min(wake, row["next_at"])
            time.sleep(max(0.05, min(0.5, wake - time.time())))


def _pending(db_path: Path) -> bool:
    db = _db(db_path)
    try:
        return db.execute("SELECT 1 FROM notify_deliveries WHERE state='pending' LIMIT 1").fetchone() is not None
    finally:
        db.close()


def drain(db_path: Path, locks_dir: Path) -> int:
    ensure_schema(db_path)
    db = _db(db_path)
    try:  # a message a day late is noise: what was left (drainer killed, machine off) expires
        db.execute("UPDATE notify_deliveries SET state='failed', last_error='expired: not delivered within "
                   "24 h' WHERE state='pending' AND created_at < ?", (time.time() - EXPIRE_S,))
    finally:
        db.close()
    while True:
        lock = _try_lock(locks_dir)
        if lock is None:
            return 0  # another drainer has it; it looks again before it leaves
        try:
            (locks_dir / "notify-drain.pid").write_text(f"{os.getpid()}\n")
            _drain_locked(db_path)
        finally:
            lock.release()
        if not _pending(db_path):
            return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "drain":
        print("usage: python -m eaglelab.control.notify drain REGISTRY_DB LOCKS_DIR", file=sys.stderr)
        return 2
    return drain(Path(argv[1]), Path(argv[2]))


if __name__ == "__main__":
    sys.exit(main())
