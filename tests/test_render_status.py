"""`lab status`'s text: a ready service shows its serving figures, not its loading bar and an ETA;
a job keeps its progress and ETA."""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console

from eaglelab.control.render import eta_text, print_status, progress_text, stage_eta_text

LOADED = {"label": "Loading safetensors checkpoint shards", "n": 4, "total": 4, "unit": "it"}
ETA = {"finish_at": "2026-12-02T14:00:00.000Z", "finish_low_at": "2026-12-02T13:59:00.000Z",
       "finish_high_at": "2026-12-02T14:02:00.000Z", "eta_s": 0.0}


def test_ready_service_shows_serving_figures_and_no_eta():
    run = {"kind": "service", "state": "running", "eta": ETA,
           "log_state": {"ready": True, "phase": "serving", "progress": LOADED,
                         "metrics": {"vllm/gen_tokens_per_s": [[0, 10.0], [1, 57.25]],
                                     "vllm/running_reqs": [[0, 1.0], [1, 3.0]]}}}
    assert progress_text(run) == "up, serving · 57.2 tok/s generated · 3 requests running"
    assert eta_text(run) == ""
    run["log_state"]["metrics"] = {}
    assert progress_text(run) == "up, serving (no request stats logged yet)"


def test_service_still_loading_and_jobs_keep_progress_and_eta():
    loading = {"kind": "service", "state": "running", "eta": ETA,
               "log_state": {"ready": False, "phase": "loading", "progress": dict(LOADED, n=2)}}
    assert progress_text(loading) == "loading 2/4 it" and eta_text(loading) != ""
    job = {"kind": "job", "state": "running", "eta": ETA,
           "log_state": {"phase": "training", "progress": {"label": "training steps", "n": 12, "total": 84,
                                                           "unit": "step"}}}
    assert progress_text(job) == "training 12/84 step" and eta_text(job) != ""


# --- what the text says when reality disagrees with the estimate; narrow terminals ---------------



def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def test_a_run_past_its_estimate_is_overdue_not_due_in_0s():
    now = time.time()
    run = {"kind": "job", "state": "running", "eta": {"finish_at": _iso(now - 12 * 60)},
           "log_state": {"phase": "generating", "progress": {"n": 90, "total": 100, "unit": "it"}}}
    text = eta_text(run, now)
    want = time.strftime("%H:%M", time.localtime(now - 12 * 60))
    assert text == f"overdue by 12 min (estimate was {want})"
    assert "in 0" not in text


def test_a_stalled_run_has_no_eta_not_zero():
    run = {"kind": "job", "state": "stalled", "eta": {"finish_at": _iso(time.time() + 60), "eta_s": 0.0},
           "log_state": {"progress": {"n": 5, "total": 100}}}
    assert eta_text(run) == "unknown (stalled)"
    assert stage_eta_text({"state": "stalled"}, run) == "unknown (stalled)"


def test_an_ended_stage_shows_its_end_not_its_last_phase():
    ended = time.time() - 600
    done = {"kind": "job", "state": "completed", "ended_at": _iso(ended),
            "log_state": {"phase": "generating", "progress": {"n": 64, "total": 64, "unit": "it"}}}
    assert progress_text(done) == "ended " + time.strftime("%H:%M", time.localtime(ended))
    failed = {"kind": "job", "state": "failed", "ended_at": _iso(ended),
              "log_state": {"phase": "generating", "progress": {"n": 3, "total": 64, "unit": "it"},
                            "failure": {"reason": "cuda_oom"}}}
    assert "generating" not in progress_text(failed) and progress_text(failed).endswith("at 3/64 it [cuda_oom]")


def test_a_ready_service_says_it_is_up_even_when_its_log_is_quiet():
    run = {"kind": "service", "state": "stalled", "eta": ETA,
           "log_state": {"ready": True, "phase": "serving", "progress": LOADED, "metrics": {}}}
    assert progress_text(run).startswith("up, serving") and eta_text(run) == ""


STATES = ("completed", "running", "failed", "stalled", "pending", "unreachable", "killed")


def _status() -> dict:
    now = time.time()
    stages, runs = [], []
    for i, (name, state) in enumerate(zip(("synth", "prepare", "serve_extract", "extract", "vocab", "train", "eval"),
                                          STATES)):
        rid = f"{name}-20261204T0{i}4341-c68{i}"
        stages.append({"name": name, "host": "gpu-node-1", "state": state, "latest_run": rid,
                       "eta": {"finish_at": _iso(now + 3600), "finish_low_at": _iso(now + 3000),
                               "finish_high_at": _iso(now + 4000), "source": "prior"}})
        runs.append({"id": rid, "stage": name, "host": "gpu-node-1", "state": state, "kind": "job",
                     "duration_s": 3723.0, "ended_at": _iso(now - 60), "exit_code": 1 if state == "failed" else 0,
                     "eta": {"finish_at": _iso(now + 1800), "finish_low_at": _iso(now + 1500),
                             "finish_high_at": _iso(now + 2400)},
                     "log_state": {"phase": "generating responses with the target model",
                                   "progress": {"n": 1234, "total": 10000, "unit": "samples"},
                                   **({"failure": {"reason": "cuda_oom"}} if state == "failed" else {})}})
    return {"profile": "demo", "hosts": [{"name": "gpu-node-1", "reach": "ssh", "reachable": True, "gpus": []}],
            "stages": stages, "runs": runs, "pipeline": {}}


@pytest.mark.parametrize("width", [80, 120])
def test_lab_status_keeps_state_words_whole_and_each_stage_to_two_lines(width):
    buf = io.StringIO()
    print_status(_status(), console=Console(file=buf, width=width, force_terminal=False, color_system=None))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= width
    table = lines[lines.index(next(x for x in lines if x.startswith("pipeline"))):]
    for state in STATES:  # every state word whole, on one line
        assert any(re.search(rf"\b{state}\b", x) for x in table), (state, "\n".join(table))
    starts = [i for i, x in enumerate(table) if re.match(r"^\W*(synth|prepare|serve_extract|extract|vocab|train|eval)\b", x)]
    assert len(starts) == len(STATES)
    body_end = max(i for i, x in enumerate(table) if x.strip() and not set(x.strip()) <= set("━─┗┛┻└┘┴ "))
    for a, b in zip(starts, starts[1:] + [body_end + 1]):
        rows = [x for x in table[a:b] if x.strip() and not set(x.strip()) <= set("━─┃│├┤┼┠┨╂ ")]
        assert len(rows) <= 2, "\n".join(table[a:b])


def test_a_stuck_bar_has_an_unknown_eta_not_finishing_now(tmp_path):
    """Issue 32: a bar that stopped moving (its log still `running`, not yet called stalled) read
    "finishing now, range [0, 0]" for as long as it stayed stuck: its remaining time counted down
    from its last frame. Past the slow end of its own estimate it is unknown (`source: stalled`,
    the reason said) in the JSON, on the terminal and on the page; a bar that moves keeps its ETA.
    The state is the tailer's, from a real log of tqdm frames written 2 s apart."""
    from eaglelab.eta.schedule import annotate
    from eaglelab.host.tail.run import RunFollower
    from status_web.model import cell

    t0 = 1_800_000_000.0
    mmss = lambda s: b"%02d:%02d" % divmod(s, 60)
    frames = b"".join(b"\rWorking: %3d%%|##| %d/100 [%s<%s, 2.00s/it]" % (n, n, mmss(2 * n), mmss(2 * (100 - n)))
                      for n in range(0, 21)) + b"\r"
    (tmp_path / "output.log").write_bytes(frames)
    f = RunFollower(tmp_path, clock=lambda: t0 + 40)
    f.read()
    log = f.snapshot()
    assert log["state"] == "running" and log["progress"]["n"] == 20

    def seen_at(now: float) -> tuple[dict, dict]:
        run = {"id": "w-1", "stage": "work", "host": "h", "kind": "job", "state": "running",
               "started_at": _iso(t0), "log_state": log}
        status = annotate({"schema": 1, "profile": "p", "runs": [run], "hosts": [],
                           "stages": [{"name": "work", "state": "running", "run": "w-1", "host": "h"}]}, {}, now)
        return status["runs"][0], status["stages"][0]

    moving, _ = seen_at(t0 + 45)
    assert moving["eta"]["source"] == "progress" and moving["eta"]["eta_s"] > 60
    stuck, stage = seen_at(t0 + 40 + 1200)  # 20 min without a frame, at 2 s/it
    assert stuck["eta"]["eta_s"] is None and stuck["eta"]["finish_at"] is None, stuck["eta"]
    assert stuck["eta"]["source"] == "stalled" and "has not moved for" in stuck["eta"]["reason"]
    assert eta_text(stuck, t0 + 1240) == "unknown (stalled)"
    page = cell(stage, stuck, {}, t0 + 1240)["eta"]
    assert "has not moved" in page["unknown"], page
