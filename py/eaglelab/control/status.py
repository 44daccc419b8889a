"""The whole lab as one object (eaglelab.lab_status.Status): `lab status`, `lab status --json` and
`GET /api/status` all call collect(), so the terminal and the page can never disagree. The ETA
engine and the forecast speak JSON (their documented interfaces), so the document is built first and
read into the object once; the edges write it back with `to_json`. Fields: docs/interfaces.md."""

from __future__ import annotations

import time

from eaglelab import eta, model, side_jobs
from eaglelab.fsutil import utcnow_iso
from eaglelab.lab_status import Status
from eaglelab.model import ACTIVE, RunState, StageState

from .foresight import forecast
from .lab import Lab
from .pipeline.side_runs import failure_of
from .priors import stage_priors

SCHEMA = 1
RUN_FIELDS = model.RUN_FIELDS


def collect(lab: Lab, refresh: bool = True, now: float | None = None) -> Status:
    now = now or time.time()
    errors = lab.refresh() if refresh else {}
    hosts_seen = lab.registry.hosts()
    hosts = []
    for name, h in lab.cfg.hosts.items():
        seen = hosts_seen.get(name, {})
        # a host nobody has asked yet (`--no-refresh`, a host just added) is not known to be up
        contacted = name in hosts_seen or name in errors
        hosts.append({"name": name, "reach": h.reach, "contacted": contacted,
                      "reachable": seen.get("reachable", not errors.get(name)) if contacted else None,
                      "unreachable_since": seen.get("unreachable_since"), "checked_at": seen.get("checked_at"),
                      "error": errors.get(name) or (seen.get("error") if not seen.get("reachable", True) else None),
                      "gpus": seen.get("gpus"), "gpus_configured": h.gpus,
                      "free_disk_bytes": seen.get("free_disk_bytes"), "load": seen.get("load"),
                      "bad_runs": seen.get("bad_runs") or [],
                      **({"slurm": {"partition": h.slurm.partition, "error": seen.get("slurm_error")}}
                         if h.reach == "slurm" and h.slurm else {})})
    unreachable = {h["name"] for h in hosts if h["reachable"] is False}
    runs = []
    for r in lab.registry.runs():
        run = {k: r.get(k) for k in RUN_FIELDS}
        ls = run.get("log_state") or {}
        if run["state"] == RunState.RUNNING and ls.get("state") == StageState.STALLED:
            run["stalled"] = True
        run["host_unreachable"] = run["host"] in unreachable
        if run.get("slurm") is None:
            run.pop("slurm")  # only runs of a Slurm host carry it (job id, queue, nodes, queued_s)
        runs.append(run)
    stages = []
    for name in lab.cfg.stage_order():
        s = lab.cfg.stage(name)
        latest = next((r for r in reversed(runs) if r["stage"] == name), None)
        state = StageState(latest["state"]) if latest else StageState.PENDING
        if latest and latest.get("stalled"):
            state = StageState.STALLED
        if latest and latest["host_unreachable"] and state in ACTIVE:
            state = StageState.UNREACHABLE
        stages.append({"name": name, "host": s.host, "kind": s.kind, "depends_on": s.depends_on, "needs": s.needs,
                       "after": s.after,
                       "description": s.description, "latest_run": latest["id"] if latest else None, "state": state})
    # services.py takes filelock, which `lab status --json` does not load otherwise (test_cli_imports)
    from .pipeline.services import usage
    status = {"schema": SCHEMA, "generated_at": utcnow_iso(now), "profile": lab.cfg.profile,
              "runs": runs, "hosts": hosts, "stages": stages, "services": usage(lab, now)}
    status = forecast.annotate(lab, _annotate_eta(lab, status, now, refresh), now)
    status["pipeline"]["side_jobs"] = side_jobs_view(lab, runs)
    return Status.from_json(status, now)


def side_jobs_view(lab: Lab, runs: list[dict]) -> list[dict]:
    """pipeline.side_jobs: each pilot / smoke test, what it runs beside, its latest run and why it failed."""
    out = []
    for name in side_jobs.side_jobs(lab.cfg):
        s = lab.cfg.stage(name)
        latest = next((r for r in reversed(runs) if r["stage"] == name), None)
        state = (latest or {}).get("state") or StageState.PENDING
        try:  # a failure under an earlier config says nothing of the next run (no host asked: no inputs)
            current = bool(latest) and latest.get("fingerprint") == lab.fingerprint(s)
        except Exception:  # noqa: BLE001 - the view never breaks `lab status`
            current = False
        out.append({"current_config": current, "stage": name, "beside": s.during.stage, "after": side_jobs.after_units(lab.cfg, s),
                    "smoke_of": s.smoke_of, "state": state, "run": (latest or {}).get("id"),
                    "ended_at": (latest or {}).get("ended_at"),
                    "reason": failure_of(latest) if latest and state in (RunState.FAILED, RunState.KILLED) else None,
                    **({"engine": engine_figures(latest)} if name == "engine_check" and latest else {})})
    return out


def engine_figures(run: dict) -> dict | None:
    """The engine check's figures from its metric line (eaglelab.stages.engine_check), None before it; `alarm`
    only when the run failed with them: the engine-path alarm (docs/foresight.md, "The engine check")."""
    metrics = (run.get("log_state") or {}).get("metrics") or {}
    try:
        got = {k: float(metrics[f"engine/{k}"][-1][1]) for k in ("served_rate", "offline_rate", "ratio", "min_ratio")}
        got["drafts"] = int(metrics["engine/drafts"][-1][1])
        flagged = bool(metrics["engine/alarm"][-1][1])
        if "engine/outputs_impossible" in metrics:  # the output probe ran (eaglelab.stages.output_probe)
            got["outputs_impossible"] = float(metrics["engine/outputs_impossible"][-1][1])
            got["outputs_fault"] = bool(metrics["engine/outputs_fault"][-1][1])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return {**got, "alarm": flagged and run.get("state") == RunState.FAILED, "run": run.get("id")}


def _annotate_eta(lab: Lab, status: dict, now: float, refresh: bool = False) -> dict:
    priors, units = stage_priors(lab, status["runs"], refresh)  # input sizes: measured on the hosts when due
    return eta.annotate(status, {"phases": lab.registry.phase_history(), "units": units}, now, priors)
