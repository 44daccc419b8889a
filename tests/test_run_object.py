"""One object from the host to the page (issue 31, item 2): eaglelab.model.Run is THE field list of
a run — RUN_FIELDS, the registry's columns and the controller's check are derived from it — with
from_json/to_json; `stop_requested` reaches the page; the display states are one enum; the
pipeline_finished webhook's payload is pinned."""

from __future__ import annotations

import json
import socket
import sqlite3

import pytest

from eaglelab import model
from eaglelab.control import notify
from eaglelab.control.registry import RUN_COLUMNS, Registry
from eaglelab.lab_status import StageStatus
from eaglelab.logstate import Finish, LogState, Progress
from eaglelab.model import RUN_FIELDS, BadRecord, Run, RunState, StageState, check
from status_web import model as web

REPORTED = {"id": "t-1", "stage": "t", "host": "local", "state": "killed", "exit_code": None, "signal": 15,
            "started_at": "2026-12-04T10:00:00.000Z", "ended_at": "2026-12-04T10:01:00.000Z", "duration_s": 60.0,
            "lost": False, "stop_requested": True, "log_state": {"schema": 1, "state": "killed"},
            "heartbeat_at": "2026-12-04T10:01:00.000Z", "command": ["sleep", "600"]}  # the last two: extra


def test_a_run_goes_to_json_and_back_unchanged_extra_keys_included():
    run = Run.from_json(check(Run, dict(REPORTED), "test"))
    assert run.state is RunState.KILLED and run.stop_requested is True
    assert run.extra == {"heartbeat_at": REPORTED["heartbeat_at"], "command": ["sleep", "600"]}
    back = run.to_json()
    assert json.loads(json.dumps(back)) == {**{f: None for f in RUN_FIELDS}, "orphaned": False, "orphans": False,
                                            **REPORTED}
    assert Run.from_json(back) == run


def test_the_check_names_the_field_and_what_it_expected():
    with pytest.raises(BadRecord, match=r"run x: stop_requested is 'yes', expected bool \(Run\)"):
        check(Run, {**REPORTED, "stop_requested": "yes"}, "run x")
    with pytest.raises(BadRecord, match=r"missing state \(Run\)"):
        check(Run, {"id": "a", "stage": "s", "host": "h"}, "run x")


def test_the_registry_columns_are_the_run_fields_and_an_old_registry_gains_the_new_ones(tmp_path):
    assert list(RUN_COLUMNS)[:len(RUN_FIELDS)] == list(RUN_FIELDS)
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:  # a registry of the first release: no stop_requested, no orphaned ...
        db.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, stage TEXT NOT NULL, host TEXT NOT NULL, profile TEXT, "
                   "fingerprint TEXT, kind TEXT, state TEXT NOT NULL, exit_code INTEGER, signal INTEGER, "
                   "started_at TEXT, ended_at TEXT, duration_s REAL, run_dir TEXT, pid INTEGER, pgid INTEGER, "
                   "lost INTEGER DEFAULT 0, log_state TEXT, updated_at TEXT)")
        db.execute("INSERT INTO runs (id, stage, host, state) VALUES ('old-1', 'old', 'h', 'completed')")
    reg = Registry(path)
    assert reg.get("old-1")["stop_requested"] is False
    reg.upsert(REPORTED)
    stored = reg.get("t-1")
    assert {f: stored[f] for f in RUN_FIELDS if f in REPORTED} == {f: REPORTED[f] for f in RUN_FIELDS if f in REPORTED}
    assert stored["stop_requested"] is True


def test_a_stop_asked_with_lab_stop_shows_as_such_in_the_json_and_on_the_page(tmplab):
    """Before issue 31 the registry dropped `stop_requested`, so "(stop requested)" never showed."""
    tmplab.write_pipeline("""
        stages:
          sleeper:
            host: local
            command: ["${python}", "-c", "import time; print('up', flush=True); time.sleep(600)"]
            stop_grace_s: 2
        """)
    tmplab.lab("run", "sleeper", "--detach")
    (run,) = tmplab.runs("sleeper")
    assert run["stop_requested"] is False
    tmplab.wait_for(lambda: b"up" in (tmplab.work / "runs" / run["id"] / "output.log").read_bytes())
    tmplab.lab("stop", "sleeper")
    (run,) = tmplab.runs("sleeper")
    assert (run["state"], run["stop_requested"]) == ("killed", True)
    assert web.exit_view(run) == "killed: signal 15 (stop requested)"


def test_the_display_states_are_one_enum_over_the_run_states():
    assert {s.value for s in RunState} < {s.value for s in StageState}
    assert StageState.STALLED == "stalled" and StageState("gated") is StageState.GATED
    from status_web import metrics
    assert set(metrics.STAGE_STATES) <= {s.value for s in StageState}


@pytest.mark.parametrize("eta,now,expected", [
    ({"finish_at": "2026-12-04T12:00:00.000Z", "finish_low_at": "2026-12-04T11:50:00.000Z",
      "finish_high_at": "2026-12-04T12:20:00.000Z", "source": "history"},
     0.0, (1796385600.0, 1796385000.0, 1796386800.0, "history")),
    ({"eta_s": 60, "eta_low_s": 30, "eta_high_s": 90}, 1000.0, (1060.0, 1030.0, 1090.0, None)),
    ({"finish_at": "2026-12-04T12:00:00.000Z", "eta_low_s": 30}, 1000.0, (1796385600.0, 1030.0, None, None)),
    ({"eta_s": None}, 1000.0, None), (None, 1000.0, None), ("garbage", 1000.0, None),
])
def test_a_finish_estimate_is_read_from_either_encoding_once(eta, now, expected):
    fin = Finish.from_json(eta, now)
    assert (None if fin is None else (fin.at, fin.low, fin.high, fin.source)) == expected
    if fin is not None:
        assert Finish.from_json(fin.to_json(), now) == fin
        stage = StageStatus.from_json({"name": "s", "host": "h", "eta": eta}, now)
        assert web.run_finish(None, stage) == fin  # the page's finish is the engine's, read once


def test_the_pipeline_finished_payload_is_pinned():
    stages = [{"stage": "train", "run_id": "train-1", "outcome": "completed"}]
    payload = notify.pipeline_finished(None, firing_id="f-1", target="all", ok=False, detail="train failed: cuda_oom",
                                       failed_stage="train", stages=stages, duration_s=3723.4567, log="/l/f-1.log",
                                       now=1796385600.0)
    host = socket.gethostname()
    assert payload == {
        "schema": 1, "event": "pipeline_finished", "target": "all", "firing_id": "f-1", "ok": False, "host": host,
        "failed_stage": "train", "stages": stages, "duration_s": 3723.457, "reason": "train failed: cuda_oom",
        "log": "/l/f-1.log", "status_url": None, "at": "2026-12-04T12:00:00.000Z",
        "text": f"all stopped at train on {host} after 1h 02m: train failed: cuda_oom"}
    ok = notify.pipeline_finished(None, firing_id="f-2", target="all", ok=True, detail="5 stages", failed_stage=None,
                                  stages=[], duration_s=59.0, log=None, now=1796385600.0)
    assert (ok["reason"], ok["text"]) == (None, f"all finished on {host} in 59s: 5 stages")
    assert json.loads(json.dumps(payload)) == payload
    assert model.RunState.FAILED == "failed"  # members on the wire are their values


@pytest.mark.parametrize("progress,expected", [
    ({"label": "shards", "n": 55, "total": 64, "unit": "shard", "rate_s_per_it": 27.81, "eta_s": 250.0,
      "history": [[1, 1]]}, (55.0, 64.0, "shard", 250.0)),
    ({"n": 3, "total": "many", "rate_s_per_it": float("nan"), "eta_s": True}, (3.0, None, "it", None)),
    ({"n": None, "total": 64}, None), ("garbage", None), (None, None),
])
def test_the_log_state_and_its_progress_are_read_once_garbled_fields_as_absent(progress, expected):
    ls = LogState.from_json({"schema": 1, "state": "running", "progress": progress, "lines": 12})
    p = ls.progress
    assert (None if p is None else (p.n, p.total, p.unit, p.eta_s)) == expected
    assert ls.state == "running" and ls.extra == {"schema": 1, "lines": 12}
    if p is not None and expected[1] is not None:
        assert Progress.from_json(p.to_json()) == p and p.to_json()["history"] == [[1, 1]]
    assert LogState.from_json([1, 2]) is None
    view = web.progress_view({"progress": progress})
    assert (view is None) == (p is None)


FAILED_RUN = {"id": "train-20261204T100000-ab12", "stage": "train", "host": "gpu1", "state": "failed", "profile": "demo",
              "exit_code": 1, "signal": None, "started_at": "2026-12-04T10:00:00.000Z",
              "ended_at": "2026-12-04T11:02:05.000Z", "duration_s": 3725.0, "heartbeat_at": "2026-12-04T11:02:00.000Z",
              "log_state": {"state": "failed", "failure": {"reason": "cuda_oom", "message": "CUDA out of memory",
                                                           "line": 812}}}


def test_a_stage_events_payload_is_built_from_the_typed_run_and_pinned():
    """The `failed` webhook body, byte for byte (keys in order): what the registry's observer queues
    from the typed Run, and the same from the registry's record."""
    run = Run.from_json(dict(FAILED_RUN))
    payload = notify.stage_payload("failed", run, "http://lab:8765/", 1796385600.0)
    assert json.dumps(payload) == (
        '{"schema": 1, "event": "failed", "stage": "train", "host": "gpu1", "run_id": "train-20261204T100000-ab12", '
        '"state": "failed", "profile": "demo", "duration_s": 3725.0, "started_at": "2026-12-04T10:00:00.000Z", '
        '"ended_at": "2026-12-04T11:02:05.000Z", "exit_code": 1, "signal": null, '
        '"failure": {"reason": "cuda_oom", "message": "CUDA out of memory", "line": 812}, '
        '"reason": "cuda_oom: CUDA out of memory", "status_url": "http://lab:8765/", '
        '"text": "train failed on gpu1 after 1h 02m: cuda_oom: CUDA out of memory", "at": "2026-12-04T12:00:00.000Z"}')
    assert notify.stage_payload("failed", dict(FAILED_RUN), "http://lab:8765/", 1796385600.0) == payload
    stalled = Run.from_json({**FAILED_RUN, "state": "running", "exit_code": None,
                             "log_state": {"state": "stalled", "stall": {"message": " no new line for 20 min "}}})
    got = notify.stage_payload("stalled", stalled, None, 1796385600.0)
    assert (got["state"], got["reason"], got["failure"], got["text"]) == (
        "running", "no new line for 20 min", None, "train stalled on gpu1 (running for 1h 02m): no new line for 20 min")
    assert notify.events_for(Run.from_json({**FAILED_RUN, "state": "running", "log_state": None}), stalled) == ["stalled"]
