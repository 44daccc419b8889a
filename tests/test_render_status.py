"""`lab status`'s text: a ready service shows its serving figures, not its loading bar and an ETA;
a job keeps its progress and ETA."""

from __future__ import annotations

from eaglelab.control.render import eta_text, progress_text

LOADED = {"label": "Loading safetensors checkpoint shards", "n": 4, "total": 4, "unit": "it"}
ETA = {"finish_at": "2026-12-02T14:00:00.000Z", "finish_low_at": "2026-12-02T13:59:00.000Z",
       "finish_high_at": "2026-12-02T14:02:00.000Z", "eta_s": 0.0}


def test_ready_service_shows_serving_figures_and_no_eta():
    run = {"kind": "service", "state": "running", "eta": ETA,
           "log_state": {"ready": True, "phase": "serving", "progress": LOADED,
                         "metrics": {"vllm/gen_tokens_per_s": [[0, 10.0], [1, 57.25]],
                                     "vllm/running_reqs": [[0, 1.0], [1, 3.0]]}}}
    assert progress_text(run) == "serving · 57.2 tok/s generated · 3 requests running"
    assert eta_text(run) == ""
    run["log_state"]["metrics"] = {}
    assert progress_text(run) == "serving (no request stats logged yet)"


def test_service_still_loading_and_jobs_keep_progress_and_eta():
    loading = {"kind": "service", "state": "running", "eta": ETA,
               "log_state": {"ready": False, "phase": "loading", "progress": dict(LOADED, n=2)}}
    assert progress_text(loading) == "loading 2/4 it" and eta_text(loading) != ""
    job = {"kind": "job", "state": "running", "eta": ETA,
           "log_state": {"phase": "training", "progress": {"label": "training steps", "n": 12, "total": 84,
                                                           "unit": "step"}}}
    assert progress_text(job) == "training 12/84 step" and eta_text(job) != ""
