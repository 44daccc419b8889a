"""A temporary lab for the web tests: its own conf dir (lab.yaml with logs_dir and the host's work_dir
in tmp, the repo's pipeline with a quicker tick) and hand-made run directories for odd cases."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def make_conf(tmp: Path, tick_steps: int = 40, tick_delay: float = 0.1, web: dict | None = None) -> Path:
    conf = tmp / "conf"
    (conf / "profiles").mkdir(parents=True, exist_ok=True)
    lab = {"profile": "none", "logs_dir": str(tmp / "logs"),
           "hosts": {"local": {"reach": "local", "work_dir": str(tmp / "work"), "repo_dir": str(REPO),
                               "python": sys.executable}}}
    if web:
        lab["web"] = web
    (conf / "lab.yaml").write_text(yaml.safe_dump(lab))
    pipe = yaml.safe_load((REPO / "conf" / "pipeline.yaml").read_text())
    pipe["vars"].update({"data": str(tmp / "data"), "tick_steps": str(tick_steps), "tick_delay": str(tick_delay)})
    (conf / "pipeline.yaml").write_text(yaml.safe_dump(pipe))
    return conf


def make_run_dir(work: Path, run_id: str, *, stage: str = "tick", log: bytes = b"", state_json: bytes | None = None,
                 exit_code: int | None = 0, started_at: str = "2027-01-15T07:00:00.000Z",
                 ended_at: str = "2027-01-15T07:10:00.000Z") -> Path:
    """A finished run's directory as jobwrap leaves it (meta, log, exit), written by hand."""
    d = work / "runs" / run_id
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"schema": 1, "run_id": run_id, "stage": stage, "host": "local",
                                             "profile": "none", "command": ["true"], "cwd": str(REPO),
                                             "started_at": started_at, "kind": "job"}))
    (d / "output.log").write_bytes(log)
    if state_json is not None:
        (d / "state.json").write_bytes(state_json)
    if exit_code is not None:
        (d / "exit.json").write_text(json.dumps({"schema": 1, "exit_code": exit_code, "signal": None,
                                                 "ended_at": ended_at,
                                                 "state": "completed" if exit_code == 0 else "failed"}))
    return d
