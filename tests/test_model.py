"""One shape for a run (eaglelab.model): the one end-state rule that jobwrap, the parser and the
notifications share; the models validated where data enters; docs/interfaces.md kept true to them;
a bad run directory named and skipped, never fatal."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import get_type_hints

import pytest

from conftest import REPO
from eaglelab import model
from eaglelab.control import notify
from eaglelab.control.lab import checked_report
from eaglelab.host import hostside, jobwrap
from eaglelab.host.parse.state import combine_with_exit
from eaglelab.model import RunState, decide_end

# (exit_code, signal, stop_requested) -> (state, failure reason)
ENDS = [
    ((0, None, False), ("completed", None)),
    ((3, None, False), ("failed", "other")),
    ((124, None, False), ("failed", "timeout")),
    ((137, None, False), ("failed", "host_oom_killed")),
    ((130, None, False), ("killed", None)),
    ((None, signal.SIGKILL, False), ("failed", "host_oom_killed")),  # nobody asked: a failure
    ((None, signal.SIGKILL, True), ("killed", None)),                # `lab stop` after the grace
    ((None, signal.SIGTERM, False), ("killed", None)),
    ((None, signal.SIGINT, False), ("killed", None)),
    ((None, signal.SIGSEGV, False), ("failed", "segfault")),
    ((139, None, False), ("failed", "segfault")),
    ((None, signal.SIGABRT, False), ("failed", "signal")),
    ((0, None, True), ("completed", None)),  # asked to stop, but it finished first
]


@pytest.mark.parametrize("args,expected", ENDS, ids=[f"{a}" for a, _ in ENDS])
def test_one_rule_decides_every_end_the_same_everywhere(args, expected):
    code, sig, stop = args
    ending = decide_end(code, sig, stop_requested=stop)
    assert (ending.state.value, (ending.failure or {}).get("reason")) == expected
    # jobwrap's exit.json, the parser's final state and the notification agree on it
    assert jobwrap.end_state(code, sig, stop) == expected[0]
    exit_info = {"exit_code": code, "signal": sig, "signal_name": model.signal_text(sig), "stop_requested": stop}
    combined = combine_with_exit({"schema": 1, "state": "running"}, exit_info)
    assert (combined["state"], (combined["failure"] or {}).get("reason")) == expected
    events = notify.events_for({"state": "running"}, {"state": expected[0], "stop_requested": stop})
    assert events == {"completed": ["completed"], "failed": ["failed"], "killed": []}[expected[0]]


def test_the_reason_the_log_named_wins_over_the_exit_status():
    named = {"reason": "cuda_oom", "message": "torch.OutOfMemoryError: CUDA out of memory", "line": 7}
    ending = decide_end(None, signal.SIGKILL, named=named)
    assert ending.state is RunState.FAILED and ending.failure["reason"] == "cuda_oom"
    assert decide_end(1, None, last_line="boom").failure["message"] == "ended by exit code 1; last line: boom"


def test_run_state_is_a_string_on_the_wire_and_in_sets():
    assert json.dumps({"s": RunState.FAILED}) == '{"s": "failed"}'
    assert "running" in model.ACTIVE and RunState.KILLED in {"killed"} and RunState.PENDING.active
    assert set(model.ACTIVE) | set(model.FINAL) == set(RunState)


def test_how_it_ended_prefers_the_diagnosis_then_the_exit_status():
    assert model.how_it_ended({"log_state": {"failure": {"reason": "disk_full", "message": "No space"}}}) \
        == "disk_full: No space"
    assert model.how_it_ended({"signal": 9}) == "signal 9"
    assert model.how_it_ended({"exit_code": 2}) == "exit code 2"
    assert "vanished" in model.how_it_ended({"lost": True})
    assert model.how_it_ended({"exit_code": 0}) is None


def _section(doc: str, heading: str) -> str:
    start = doc.index(heading)
    nxt = doc.find("\n## ", start + 1)
    return doc[start:nxt if nxt > 0 else None]


def test_interfaces_doc_lists_every_field_of_the_models():
    doc = (REPO / "docs" / "interfaces.md").read_text()
    run_dir = _section(doc, "## The run directory")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+\.json)` \|[^|]*\| (.*) \|$", run_dir, re.M)}
    for file, cls in (("meta.json", model.Meta), ("exit.json", model.Exit)):
        documented = set(re.findall(r"\b(\w+)\b", rows[file]))
        missing = set(get_type_hints(cls)) - documented
        assert not missing, f"docs/interfaces.md, {file}: fields of eaglelab.model.{cls.__name__} not listed: {missing}"
    status = _section(doc, "## `lab status --json`")
    missing = [f for f in model.RUN_FIELDS if f'"{f}"' not in status]
    assert not missing, f"docs/interfaces.md, runs[*]: fields of eaglelab.model.RunRecord not listed: {missing}"
    states = set(re.findall(r"`(\w+)`", _section(doc, "## Run states")))
    assert {s.value for s in RunState} <= states


def _good_run(runs: Path, run_id: str = "tick-20261202T000000-abcd") -> Path:
    d = runs / run_id
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"schema": 1, "run_id": run_id, "stage": "tick", "host": "local",
                                             "command": ["true"], "started_at": "2026-12-02T00:00:00.000Z"}))
    (d / "exit.json").write_text(json.dumps({"schema": 1, "exit_code": 0, "signal": None, "state": "completed",
                                             "ended_at": "2026-12-02T00:00:05.000Z"}))
    return d


BAD = {
    "no-meta": {},
    "meta-a-list": {"meta.json": "[1, 2]"},
    "meta-without-stage": {"meta.json": json.dumps({"schema": 1, "run_id": "x"})},
}
# exit.json there but unusable: the run is known, its end is not (failed, end_unknown, never rerun unasked)
BAD_EXIT = {"exit-wrong-type": json.dumps({"exit_code": "zero"}), "exit-a-string": '"done"',
            "exit-garbled": '{"exit_code": 0, "sta'}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_run_directory_is_named_and_skipped(tmp_path, case):
    runs = tmp_path / "work" / "runs"
    _good_run(runs)
    bad = runs / f"tick-{case}"
    bad.mkdir(parents=True, exist_ok=True)
    for name, text in BAD[case].items():
        (bad / name).write_text(text)
    rep = hostside.report(str(tmp_path / "work"))
    assert [r["id"] for r in rep["runs"]] == ["tick-20261202T000000-abcd"]
    (entry,) = rep["bad_runs"]
    assert entry["run_dir"] == str(bad) and str(bad) in entry["error"]
    json.dumps(rep)  # still one JSON answer for the ssh executor


def test_the_controller_checks_each_run_of_a_report():
    good = {"id": "a-1", "stage": "a", "state": "running", "pid": 5}
    rep = checked_report("h1", {"schema": 1, "runs": [good, {"id": "b-1", "stage": "b", "state": "exploded"},
                                                       ["not", "a", "run"]], "gpus": None})
    assert [r["id"] for r in rep["runs"]] == ["a-1"] and rep["runs"][0]["host"] == "h1"
    assert len(rep["bad_runs"]) == 2 and "state" in rep["bad_runs"][0]["error"]
    rep = checked_report("h1", {"runs": "nope"})
    assert rep["runs"] == [] and "host h1" in rep["bad_runs"][0]["error"]


def test_lab_status_survives_a_bad_run_directory_and_names_it(tmplab):
    tmplab.write_pipeline('stages:\n  quick:\n    host: local\n    command: ["true"]\n')
    tmplab.lab("run", "quick")
    bad = tmplab.work / "runs" / "quick-20990101T000000-dead"
    bad.mkdir()
    (bad / "meta.json").write_text('{"run_id": 7}')  # valid JSON, wrong shape
    st = tmplab.status()
    assert [r["state"] for r in st["runs"]] == ["completed"]
    (host,) = [h for h in st["hosts"] if h["name"] == "local"]
    assert [b["run_dir"] for b in host["bad_runs"]] == [str(bad)]
    out = tmplab.lab("status").stdout
    assert str(bad) in out and "meta.json" in out
    tmplab.lab("run", "quick")  # and the stage itself still runs (up to date: skipped)


def test_a_run_directory_of_another_user_is_never_read_nor_stopped(tmp_path):
    import os
    runs = tmp_path / "work" / "runs"
    _good_run(runs)
    planted = _good_run(runs, "tick-20261202T000009-evil")
    os.chown(planted / "meta.json", 65534, 65534)  # another user's file in a shared work dir
    rep = hostside.report(str(tmp_path / "work"))
    assert [r["id"] for r in rep["runs"]] == ["tick-20261202T000000-abcd"]
    assert "not by you" in rep["bad_runs"][0]["error"]
    with pytest.raises(model.BadRecord):
        hostside.stop(str(tmp_path / "work"), planted.name, grace_s=0.1)


def test_runs_folder_is_private(tmp_path):
    import sys
    work = tmp_path / "work"
    hostside.launch(str(work), {"stage": "s", "command": [sys.executable, "-c", "print(1)"], "cwd": str(tmp_path)})
    assert (work / "runs").stat().st_mode & 0o077 == 0
    (d,) = (work / "runs").iterdir()
    assert d.stat().st_mode & 0o077 == 0


def test_durations_are_never_negative_and_prefer_the_monotonic_measure(tmp_path):
    runs = tmp_path / "work" / "runs"
    d = _good_run(runs)
    exit_json = json.loads((d / "exit.json").read_text())
    (d / "exit.json").write_text(json.dumps({**exit_json, "duration_s": 4.25}))
    assert hostside.read_run(d)["duration_s"] == 4.25  # jobwrap's monotonic figure, not end - start
    meta = json.loads((d / "meta.json").read_text())
    (d / "meta.json").write_text(json.dumps({**meta, "started_at": "2099-01-01T00:00:00.000Z"}))
    (d / "exit.json").unlink()  # a run whose start lies ahead of the wall clock (a step back)
    assert hostside.read_run(d)["duration_s"] == 0.0


@pytest.mark.parametrize("case", sorted(BAD_EXIT))
def test_an_unreadable_exit_is_an_unknown_end_not_a_lost_run(tmp_path, case):
    runs = tmp_path / "work" / "runs"
    d = _good_run(runs)
    (d / "exit.json").write_text(BAD_EXIT[case])
    rep = hostside.report(str(tmp_path / "work"))
    (run,) = rep["runs"]
    assert run["state"] == "failed" and not run["lost"] and str(d / "exit.json") in run["end_unknown"]
    checked_report("local", rep)  # a shape the controller accepts


def test_a_stage_whose_end_is_unknown_is_not_rerun_unasked(tmplab):
    tmplab.write_pipeline('stages:\n  quick:\n    host: local\n    command: ["true"]\n')
    tmplab.lab("run", "quick")
    (run_dir,) = tmplab.run_dirs()
    (run_dir / "exit.json").write_bytes(b"\x00\x00garbage")
    p = tmplab.lab("run", "quick", check=False)
    assert p.returncode != 0 and "end of" in p.stderr and "unknown" in p.stderr and "--force" in p.stderr
    assert len(tmplab.run_dirs()) == 1
    assert "hold" in tmplab.lab("plan").stdout
    tmplab.lab("run", "quick", "--force")  # the user's word
    assert len(tmplab.run_dirs()) == 2


def test_a_malformed_launch_answer_is_an_error_not_a_key_error(tmplab):
    from eaglelab.control.lab import Lab
    from eaglelab.errors import HostError
    tmplab.write_pipeline('stages:\n  quick:\n    host: local\n    command: ["true"]\n')
    lab = Lab.load(str(tmplab.conf))
    with pytest.raises(HostError, match="the launch of quick answered"):
        lab._record_launch({"id": "quick-1"}, {"host": "local", "stage": "quick"})
