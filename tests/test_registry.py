"""The registry under concurrent writers, and after a writer is killed mid-write."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import fill_disk
from eaglelab.control.registry import Registry
from eaglelab.errors import RegistryError

WRITER = textwrap.dedent("""\
    import sys
    sys.path.insert(0, {py!r})
    from eaglelab.control.registry import Registry
    reg = Registry({db!r})
    who, n = sys.argv[1], int(sys.argv[2])
    for i in range(n):
        run = dict(id=f"{{who}}-{{i % 7}}", stage=f"stage{{i % 3}}", host=who, state="running" if i < n - 7 else "completed",
                   exit_code=0, started_at=f"2026-01-01T00:00:{{i % 60:02d}}Z", log_state={{"lines": i, "pad": "x" * 2000}})
        reg.upsert(run)
        reg.sync_host(who, {{"runs": [run], "gpus": None}})
    print("done", flush=True)
""")


def _writer(tmp_path, db, who, n):
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(py=str(__import__("eaglelab").__path__[0].rsplit("/", 1)[0]), db=str(db)))
    return subprocess.Popen([sys.executable, str(script), who, str(n)], stdout=subprocess.PIPE, text=True)


def test_concurrent_writers_lose_nothing(tmp_path):
    db = tmp_path / "registry.sqlite"
    Registry(db)
    procs = [_writer(tmp_path, db, f"w{k}", 60) for k in range(5)]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["done"] * 5
    reg = Registry(db)
    runs = reg.runs()
    assert len(runs) == 5 * 7
    assert all(r["state"] == "completed" and r["log_state"]["pad"] == "x" * 2000 for r in runs)
    assert set(reg.hosts()) == {f"w{k}" for k in range(5)}
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_writer_killed_mid_write_leaves_a_usable_registry(tmp_path):
    db = tmp_path / "registry.sqlite"
    Registry(db).upsert({"id": "keep-1", "stage": "s", "host": "h", "state": "completed", "exit_code": 0})
    for attempt in range(3):
        p = _writer(tmp_path, db, f"victim{attempt}", 100000)
        deadline = time.time() + 120  # its first write (a loaded machine takes seconds to start Python)
        while time.time() < deadline and p.poll() is None:
            with sqlite3.connect(db) as c:
                if c.execute("SELECT 1 FROM runs WHERE host = ?", (f"victim{attempt}",)).fetchone():
                    break
            time.sleep(0.05)
        time.sleep(0.2 + attempt * 0.3)  # mid-stream: it writes continuously
        p.send_signal(signal.SIGKILL)
        p.wait()
    reg = Registry(db)
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert reg.get("keep-1")["state"] == "completed"
    assert any(r["host"].startswith("victim") for r in reg.runs())  # the victims did write before dying
    reg.upsert({"id": "after", "stage": "s", "host": "h", "state": "running"})  # and it still takes writes
    assert reg.get("after")["state"] == "running"


def test_unreachable_host_keeps_its_since_and_last_report(tmp_path):
    reg = Registry(tmp_path / "r.sqlite")
    reg.sync_host("gpu1", {"runs": [], "gpus": [{"index": 0}]})
    reg.sync_host("gpu1", None, "timeout")
    since = reg.hosts()["gpu1"]["unreachable_since"]
    time.sleep(0.01)
    reg.sync_host("gpu1", None, "timeout again")
    h = reg.hosts()["gpu1"]
    assert h["reachable"] is False and h["unreachable_since"] == since and h["gpus"] == [{"index": 0}]
    reg.sync_host("gpu1", {"runs": [], "gpus": None})
    assert reg.hosts()["gpu1"]["reachable"] is True and reg.hosts()["gpu1"]["unreachable_since"] is None


def test_writer_killed_while_holding_the_write_lock(tmp_path):
    """A `lab` SIGKILLed inside a transaction: the next process opens the registry and writes."""
    db = tmp_path / "registry.sqlite"
    Registry(db).upsert({"id": "keep", "stage": "s", "host": "h", "state": "completed"})
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import sqlite3, sys, time
        db = sqlite3.connect({str(db)!r}, isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE runs SET state = 'running' WHERE id = 'keep'")
        print("holding", flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    reg = Registry(db)  # no "database is locked"
    assert reg.get("keep")["state"] == "completed"  # the dead writer's change never landed
    reg.upsert({"id": "new", "stage": "s", "host": "h", "state": "running"})
    assert {r["id"] for r in reg.runs()} == {"keep", "new"}


# -- errors that name their cause (a healthy registry is never to be thrown away) ---------------

def test_a_read_only_registry_says_so(tiny_disk):
    reg = Registry(tiny_disk / "registry.sqlite")
    reg.upsert({"id": "a-1", "stage": "a", "host": "local", "state": "running"})
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_disk)], check=True)
    with pytest.raises(RegistryError) as e:
        Registry(tiny_disk / "registry.sqlite").upsert({"id": "a-1", "stage": "a", "host": "local",
                                                         "state": "completed"})
    assert "read-only" in str(e.value) and "move it aside" not in str(e.value)


def test_a_full_disk_is_a_full_disk_not_a_broken_registry(tiny_disk):
    reg = Registry(tiny_disk / "registry.sqlite")
    fill_disk(tiny_disk / "filler")
    big = {"id": "a-1", "stage": "a", "host": "local", "state": "running", "log_state": {"x": "y" * 60_000}}
    with pytest.raises(RegistryError) as e:
        reg.upsert(big)
    assert "full" in str(e.value) and "move it aside" not in str(e.value)
    (tiny_disk / "filler").unlink()
    reg.upsert(big)  # space again: the same registry works, nothing to rebuild
    assert reg.get("a-1")["state"] == "running"


# -- several pollers, one order: a run's state never goes backwards -------------------------------

def _run(state: str, **kw) -> dict:
    return {"id": "s-1", "stage": "s", "host": "h", "state": state, **kw}


def test_an_ended_run_is_never_set_back_to_running_by_a_late_report(tmp_path):
    reg = Registry(tmp_path / "r.sqlite")
    heard = []
    reg.observers.append(lambda changes: heard.extend((b and b["state"], a["state"]) for b, a in changes))
    reg.sync_host("h", {"runs": [_run("running")]}, as_of=100.0)
    reg.sync_host("h", {"runs": [_run("completed", exit_code=0)]}, as_of=102.0)
    # a poller that asked before the end (or whose round trip overlapped it) writes last
    reg.sync_host("h", {"runs": [_run("running")]}, as_of=101.0)
    reg.sync_host("h", {"runs": [_run("running")]}, as_of=103.0)
    reg.upsert(_run("pending"))
    assert reg.get("s-1")["state"] == "completed" and reg.latest("s")["exit_code"] == 0
    assert heard == [(None, "running"), ("running", "completed")]  # the stale rows told nobody
    for final in ("failed", "killed"):
        reg.upsert({**_run(final), "id": f"s-{final}"})
        reg.sync_host("h", {"runs": [{**_run("running"), "id": f"s-{final}"}]}, as_of=1e12)
        assert reg.get(f"s-{final}")["state"] == final


def test_a_requeued_slurm_job_runs_again_only_on_a_new_attempt(tmp_path):
    reg = Registry(tmp_path / "r.sqlite")
    reg.upsert(_run("failed", slurm={"job_id": "7", "restart_count": 0}), as_of=10.0)
    reg.upsert(_run("pending", slurm={"job_id": "7", "restart_count": 0}), as_of=11.0)  # stale
    assert reg.get("s-1")["state"] == "failed"
    reg.upsert(_run("running", slurm={"job_id": "7", "restart_count": 1}), as_of=12.0)  # Slurm's new attempt
    assert reg.get("s-1")["state"] == "running"


def test_a_report_older_than_the_stored_one_does_not_overwrite_it(tmp_path):
    reg = Registry(tmp_path / "r.sqlite")
    reg.sync_host("h", {"runs": [_run("running", log_state={"progress": {"n": 5}})]}, as_of=200.0)
    reg.sync_host("h", {"runs": [_run("running", log_state={"progress": {"n": 3}})]}, as_of=199.0)
    assert reg.get("s-1")["log_state"]["progress"]["n"] == 5
    # the end is news in whatever order it arrives
    reg.sync_host("h", {"runs": [_run("completed", exit_code=0)]}, as_of=198.0)
    assert reg.get("s-1")["state"] == "completed"
    # between two ends, the later report wins (a lost run adopted from its log), not the later write
    reg.upsert({**_run("killed", lost=True), "id": "s-2"}, as_of=300.0)
    reg.upsert({**_run("completed"), "id": "s-2"}, as_of=301.0)
    reg.upsert({**_run("killed", lost=True), "id": "s-2"}, as_of=300.5)
    assert reg.get("s-2")["state"] == "completed"


def test_a_registry_without_the_as_of_column_takes_it_and_keeps_its_rows(tmp_path):
    db = tmp_path / "old.sqlite"
    from eaglelab.control import registry
    assert ", as_of REAL" in registry.SCHEMA
    with sqlite3.connect(db) as c:  # a registry of the release before as_of
        c.executescript(registry.SCHEMA.replace(", as_of REAL", ""))
        c.execute("INSERT INTO runs (id, stage, host, state) VALUES ('old-1', 's', 'h', 'completed')")
    reg = Registry(db)
    reg.upsert({"id": "old-1", "stage": "s", "host": "h", "state": "running"})
    assert reg.get("old-1")["state"] == "completed"
    reg.upsert({"id": "old-1", "stage": "s", "host": "h", "state": "failed", "exit_code": 2})
    assert reg.get("old-1")["exit_code"] == 2


def test_an_ended_run_reported_again_unchanged_is_not_written_again(tmp_path):
    """A refresh of a host with many finished runs wrote every row again (JSON and all): an ended run
    reported exactly as stored is left alone, and observers hear nothing; any change is written."""
    reg = Registry(tmp_path / "registry.sqlite")
    heard = []
    reg.observers.append(heard.extend)
    done = dict(id="train-1", stage="train", host="h", state="completed", exit_code=0,
                started_at="2026-01-01T00:00:00Z", ended_at="2026-01-01T01:00:00Z", lost=False,
                log_state={"state": "completed", "progress": {"n": 40, "total": 40, "history": [[0.0, 0], [4.0, 4]]}})
    running = dict(id="eval-1", stage="eval", host="h", state="running", started_at="2026-01-01T02:00:00Z",
                   log_state={"state": "running"})
    reg.upsert_many([done, running], as_of=1.0)
    assert len(heard) == 2

    def stamps():
        with sqlite3.connect(tmp_path / "registry.sqlite") as db:
            return dict(db.execute("SELECT id, as_of FROM runs"))

    heard.clear()
    reg.upsert_many([done, running], as_of=2.0)
    assert [after["id"] for _, after in heard] == ["eval-1"]  # only the running one was written again
    assert stamps() == {"train-1": 2.0, "eval-1": 2.0}  # heard as of 2.0 all the same: an older report stays older
    reg.upsert_many([{**done, "exit_code": 1}], as_of=1.5)
    assert reg.get("train-1")["exit_code"] == 0
    reg.upsert_many([{**done, "log_state": {**done["log_state"], "adopted": True}}], as_of=3.0)
    assert stamps()["train-1"] == 3.0 and reg.get("train-1")["log_state"]["adopted"] is True
    assert reg.get("train-1")["log_state"]["progress"]["history"] == [[0.0, 0], [4.0, 4]]


def test_reports_are_ordered_by_the_hosts_sequence_not_a_wall_clock(tmp_path):
    """host_seq (boot id : monotonic ns, stamped on the host) decides which report is later; the
    controller's as_of only between rows a host did not stamp (an older release)."""
    reg = Registry(tmp_path / "r.sqlite")
    progress = lambda n, seq, as_of: reg.upsert(_run("running", log_state={"progress": {"n": n}}, host_seq=seq), as_of=as_of)
    reg.upsert(_run("pending"), as_of=1e12)  # a launch record from a controller far ahead: unstamped
    progress(1, "boot-a:100", as_of=1.0)
    assert reg.get("s-1")["log_state"]["progress"]["n"] == 1  # a stamped row replaces an unstamped one
    progress(2, "boot-a:200", as_of=9e12)  # a controller hours ahead
    progress(3, "boot-a:300", as_of=5.0)   # the next report, by a right clock: later on the host
    assert reg.get("s-1")["log_state"]["progress"]["n"] == 3
    progress(0, "boot-a:250", as_of=1e13)  # read earlier on the host, written last: older news
    reg.upsert(_run("pending"), as_of=1e13)  # unstamped: never replaces what the host stamped
    assert (reg.get("s-1")["state"], reg.get("s-1")["log_state"]["progress"]["n"]) == ("running", 3)
    progress(4, "boot-b:5", as_of=1.0)  # the host rebooted since: its word is news
    assert reg.get("s-1")["log_state"]["progress"]["n"] == 4


def test_a_pause_is_taken_out_of_the_phases_it_fell_in(tmp_path):
    """exit.json's `stopped` intervals (SIGSTOP) are no work: taken out of the phase they overlap
    (its rate too), not of the others; a phase without times to place them in is not learned."""
    reg = Registry(tmp_path / "r.sqlite")
    at = lambda s: f"2026-12-04T10:00:{s:02d}Z"
    run = {"id": "x-1", "stage": "x", "host": "h", "state": "completed", "duration_s": 50.0,
           "stopped": {"total_s": 10.0, "intervals": [[at(15), at(25)]]},
           "log_state": {"phases": [
               {"name": "load", "started_at": at(0), "ended_at": at(10), "duration_s": 10.0},
               {"name": "work", "started_at": at(10), "ended_at": at(40), "duration_s": 30.0, "items": 10,
                "rate_s_per_item": 3.0},
               {"name": "untimed", "duration_s": 5.0}]}}
    reg.record_phases_from_runs([run])
    got = {p["phase"]: (p["duration_s"], p["rate_s_per_item"]) for p in reg.phase_history("x")}
    assert got == {"load": (10.0, None), "work": (20.0, 2.0), "__run__": (40.0, None)}, got
