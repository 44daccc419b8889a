"""A Slurm host on the page beside the ssh hosts: a queued stage shows Slurm's state, reason, its
place in the queue, how long it has waited and Slurm's start estimate; the timeline draws queue
time as its own segment, before the run itself."""

from __future__ import annotations

import re

import web_samples
from status_web import create_app, model

iso = web_samples.iso


def slurm_status() -> dict:
    st = web_samples.lab_status()
    st["hosts"].append({"name": "hpc", "reach": "slurm", "reachable": True, "unreachable_since": None,
                        "checked_at": iso(-1), "error": None, "gpus": None, "gpus_configured": 8,
                        "free_disk_bytes": 9 << 40, "slurm": {"partition": "gpu", "error": None}})
    st["runs"] += [
        {"id": "eval-20270115T074000-dddd", "stage": "eval", "host": "hpc", "state": "pending", "exit_code": None,
         "signal": None, "started_at": None, "ended_at": None, "duration_s": None, "lost": False, "log_state": None,
         "slurm": {"job_id": "4242", "partition": "gpu", "state": "PENDING", "reason": "Resources",
                   "queue_position": 2, "start_estimate": iso(1800), "submitted_at": iso(-1200),
                   "queued_s": 1200.0, "nodelist": None}},
        {"id": "bench-20270115T060000-eeee", "stage": "bench", "host": "hpc", "state": "completed", "exit_code": 0,
         "signal": None, "started_at": iso(-5000), "ended_at": iso(-4000), "duration_s": 1000.0, "lost": False,
         "log_state": None,
         "slurm": {"job_id": "4100", "partition": "gpu", "state": "COMPLETED", "reason": None,
                   "submitted_at": iso(-5600), "queued_s": 600.0, "nodelist": "node[01-02]"}},
    ]
    st["stages"] += [
        {"name": "eval", "host": "hpc", "kind": "job", "depends_on": ["train"],
         "latest_run": "eval-20270115T074000-dddd", "state": "pending"},
        {"name": "bench", "host": "hpc", "kind": "job", "depends_on": [],
         "latest_run": "bench-20270115T060000-eeee", "state": "completed"},
    ]
    return st


def test_a_queued_stage_shows_its_place_in_slurms_queue():
    st = slurm_status()
    app = create_app(source=lambda: web_samples.copy_of(st), start=False, clock=lambda: web_samples.NOW)
    app.extensions["eaglelab"].snapshot.refresh_now()
    html = app.test_client().get("/").get_data(as_text=True)
    cell = html[html.index('data-stage="eval"'):]
    cell = cell[:cell.index('data-stage="bench"')]
    text = re.sub(r"<[^>]+>", "", cell)
    assert "Slurm job 4242 · PENDING (Resources) · #2 in queue · queued 20m 00s" in text
    assert "start expected" in text
    assert "on node[01-02]" in html  # the finished one says where it ran
    assert 'class="seg queued"' in html


def test_queue_time_is_its_own_segment_before_the_run():
    tl = model.timeline(slurm_status(), web_samples.NOW)
    rows = {r["stage"]: r for r in tl["rows"]}
    done = [s["kind"] for s in rows["bench"]["segments"]]
    assert done[:2] == ["queued", "completed"]
    q = rows["bench"]["segments"][0]
    assert q["end"] - q["start"] == 600.0
    waiting = rows["eval"]["segments"][0]
    assert waiting["kind"] == "queued" and waiting["end"] == web_samples.NOW
