"""Status objects (schema 1, as eaglelab.control.status.collect returns them) for the web tests: a lab in
the middle of the seeds' pipeline, with the odd records a real lab produces."""

from __future__ import annotations

import copy

from eaglelab.fsutil import utcnow_iso

NOW = 1_800_000_000.0  # a fixed clock: 2027-01-15T08:00:00Z


def iso(offset_s: float) -> str:
    return utcnow_iso(NOW + offset_s)


def seeds_drift_history(n_done: int = 55) -> list[list[float]]:
    """(elapsed_s, n) of a 64-shard weight load whose per-shard time drifts 16 -> 29 s (the seeds')."""
    out, t = [[0.0, 0]], 0.0
    for i in range(1, n_done + 1):
        t += 16 + 13 * (i - 1) / 63
        out.append([round(t), i])
    return out


def lab_status() -> dict:
    hist = seeds_drift_history()
    elapsed = hist[-1][0]
    runs = [
        {"id": "synth-20270115T050000-aaaa", "stage": "synth", "host": "gpu1", "state": "completed", "exit_code": 0,
         "signal": None, "started_at": iso(-3 * 3600), "ended_at": iso(-2.5 * 3600), "duration_s": 1800.0,
         "run_dir": "/lab/runs/synth-20270115T050000-aaaa", "pid": 10, "lost": False,
         "log_state": {"schema": 1, "state": "completed", "failure": None, "progress": None, "phase": None,
                       "phases": [{"name": "generate", "duration_s": 1700.0}], "metrics": {}, "lines": 10,
                       "bad_lines": 0}},
        {"id": "extract-20270115T063000-bbbb", "stage": "extract", "host": "gpu1", "state": "running",
         "exit_code": None, "signal": None, "started_at": iso(-elapsed - 120), "ended_at": None,
         "duration_s": elapsed + 120, "run_dir": "/lab/runs/extract-20270115T063000-bbbb", "pid": 11, "lost": False,
         "eta": {"eta_s": 420.0, "eta_low_s": 350.0, "eta_high_s": 520.0, "finish_at": iso(420),
                 "finish_low_at": iso(350), "finish_high_at": iso(520)},
         "log_state": {"schema": 1, "state": "running", "failure": None, "phase": "weights_loading",
                       "progress": {"label": "Loading safetensors checkpoint shards", "n": 55, "total": 64,
                                    "unit": "shard", "rate_s_per_it": 27.81, "elapsed_s": elapsed, "eta_s": 250.0,
                                    "history": hist},
                       "phases": [{"name": "server_start", "duration_s": 40.0}], "metrics": {},
                       "lines": 300, "bad_lines": 1}},
        {"id": "train-20270114T200000-cccc", "stage": "train", "host": "gpu2", "state": "failed", "exit_code": 1,
         "signal": None, "started_at": iso(-3.6 * 3600), "ended_at": iso(-2.6 * 3600), "duration_s": 3600.0,
         "run_dir": "/lab/runs/train-20270114T200000-cccc", "pid": 12, "lost": False,
         "log_state": {"schema": 1, "state": "failed", "phase": "training", "progress": None,
                       "failure": {"reason": "cuda_oom", "line": 812,
                                   "message": "torch.OutOfMemoryError: CUDA out of memory. <script>alert(1)</script>"},
                       "phases": [{"name": "training", "duration_s": 3500.0}],
                       "metrics": {"train/loss": [[i * 10, 6.0 / (1 + i * 0.1)] for i in range(60)],
                                   "train/acc": [[i * 10, 0.2 + i * 0.008] for i in range(60)]},
                       "lines": 900, "bad_lines": 0}},
    ]
    stages = [
        {"name": "synth", "host": "gpu1", "kind": "job", "depends_on": [], "latest_run": runs[0]["id"],
         "state": "completed"},
        {"name": "extract", "host": "gpu1", "kind": "job", "depends_on": ["synth"], "latest_run": runs[1]["id"],
         "state": "running"},
        {"name": "vocab", "host": "gpu1", "kind": "job", "depends_on": ["extract"], "latest_run": None,
         "state": "pending", "eta": {"start_at": iso(420), "finish_at": iso(900), "finish_low_at": iso(800),
                                      "finish_high_at": iso(1100)}},
        {"name": "train", "host": "gpu2", "kind": "job", "depends_on": ["vocab"], "latest_run": runs[2]["id"],
         "state": "unreachable"},
    ]
    hosts = [
        {"name": "gpu1", "reach": "ssh", "reachable": True, "unreachable_since": None, "checked_at": iso(-1),
         "error": None, "gpus": [{"index": 0, "name": "NVIDIA H100", "utilization_pct": 97.0,
                                  "memory_used_mib": 70000, "memory_total_mib": 81559}], "gpus_configured": 1,
         "free_disk_bytes": 500 << 30},
        {"name": "gpu2", "reach": "ssh", "reachable": False, "unreachable_since": iso(-600), "checked_at": iso(-700),
         "error": "ssh: connect to host gpu2 port 22: No route to host", "gpus": None, "gpus_configured": 2,
         "free_disk_bytes": None},
    ]
    return {"schema": 1, "generated_at": iso(0), "profile": "seeds", "runs": runs, "hosts": hosts,
            "stages": stages, "pipeline": {"finish_at": iso(4 * 3600), "finish_low_at": iso(3.5 * 3600),
                                            "finish_high_at": iso(5 * 3600)}}


def copy_of(status: dict) -> dict:
    return copy.deepcopy(status)
