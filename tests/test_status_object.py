"""collect()'s answer is one object (eaglelab.lab_status.Status), read from the schema-1 document
once and written back unchanged at the edges; the front ends take every finish time from the ETA
engine and word it through one module (eaglelab.display) — issue 31, item 2. Pure: no lab, no
processes (the JSON edges are tested through the real `lab status --json` and /api/status in
test_web.py and the runs' tests)."""

from __future__ import annotations

import copy
import io

from rich.console import Console

import web_samples
from eaglelab import display
from eaglelab.control.render import eta_text, print_status, stage_eta_text
from eaglelab.lab_status import RunStatus, StageStatus, Status
from eaglelab.logstate import Finish
from eaglelab.model import RunState, StageState
from status_web import metrics, model

NOW = web_samples.NOW
EXTRACT = "extract-20270115T063000-bbbb"


def test_the_document_goes_through_the_object_unchanged_and_unread():
    doc = web_samples.lab_status()
    st = Status.from_json(copy.deepcopy(doc), NOW)
    assert st.to_json() == doc and st.to_json() is not st.json  # an edge may add keys to its copy
    assert "runs" not in st.__dict__  # `lab status --json` writes it without reading a run
    run = st.run(EXTRACT)
    assert run.run.state is RunState.RUNNING and run.progress.n == 55 and run.log.phase == "weights_loading"
    assert run.eta.finish == Finish(NOW + 420, NOW + 350, NOW + 520)
    assert [s.state for s in st.stages][:2] == [StageState.COMPLETED, StageState.RUNNING]


def test_an_odd_record_reads_as_absent_never_as_a_crash():
    assert RunStatus.from_json({"id": "x", "stage": "s", "host": "h", "state": "exploded"}, NOW) is None
    assert RunStatus.from_json([1, 2], NOW) is None
    odd = RunStatus.from_json({"id": "x", "stage": "s", "host": "h", "state": "failed", "exit_code": "1",
                               "duration_s": True, "log_state": "garbage", "eta": {"finish_at": "soon"}}, NOW)
    assert (odd.run.exit_code, odd.run.duration_s, odd.log, odd.eta.finish) == (None, None, None, None)
    assert StageStatus.from_json({"name": "s", "host": "h", "state": "weird"}, NOW).state is None
    assert Status.from_json("garbage", NOW).runs == ()


def _running_without_an_engine_estimate() -> dict:
    """The extract run as the page got it when the engine had no estimate: its bar still carries
    tqdm's own remaining time (eta_s 250), and the stage after it has a completed run of old."""
    status = web_samples.lab_status()
    run = next(r for r in status["runs"] if r["id"] == EXTRACT)
    run.pop("eta", None)
    assert run["log_state"]["progress"]["eta_s"] == 250.0
    for s in status["stages"]:
        s.pop("eta", None)
    status.pop("pipeline", None)
    return status


def test_no_front_end_estimates_a_finish_the_engine_did_not_give():
    status = _running_without_an_engine_estimate()
    st = Status.from_json(status, NOW)
    stage = next(s for s in st.stages if s.latest_run == EXTRACT)
    assert model.cell(stage, st.run(EXTRACT), {}, NOW)["eta"] is None  # not now + the bar's 250 s
    assert eta_text(st.run(EXTRACT), NOW) == ""
    assert b"eaglelab_stage_eta_seconds{" not in metrics.render_status(status, NOW)
    tl = model.timeline(st, NOW)
    assert tl["finish"] is None and not any(seg["kind"] == "predicted" for r in tl["rows"] for seg in r["segments"])
    assert all(r["note"] for r in tl["rows"] if not r["segments"])  # says why instead of drawing a guess


def test_the_terminal_and_the_page_word_one_finish_alike():
    fin = Finish(NOW + 3600, NOW + 3000, NOW + 4800, "history")
    page = model.eta_view(fin, NOW)
    assert (page["clock"], page["range"]) == (display.clock(NOW + 3600, NOW), display.eta_range(fin, NOW))
    assert display.eta_line(fin, NOW) == f"{page['clock']} ({page['range']})"
    late = Finish(NOW - 12 * 60)
    assert model.eta_view(late, NOW)["overdue"] == "12 min"
    assert display.eta_line(late, NOW) == f"overdue by 12 min (estimate was {display.clock(late.at, NOW)})"
    run = {"id": "r", "stage": "s", "host": "h", "state": "running", "kind": "job",
           "eta": {"finish_at": "2027-01-15T09:00:00.000Z", "finish_low_at": "2027-01-15T08:50:00.000Z",
                   "finish_high_at": "2027-01-15T09:20:00.000Z"}}
    cell = model.cell({"name": "s", "host": "h", "state": "running"}, run, {}, NOW)["eta"]
    assert eta_text(run, NOW) == f"{cell['clock']} ({cell['range']})"
    assert stage_eta_text({"name": "s", "host": "h", "state": "running"}, run, NOW) == eta_text(run, NOW)


def test_lab_status_prints_the_object_collect_returns():
    out = io.StringIO()
    print_status(Status.from_json(web_samples.lab_status(), NOW),
                 console=Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert EXTRACT in text and "weights_loading 55/64 shard" in text
    assert display.eta_line(Finish(NOW + 420, NOW + 350, NOW + 520), NOW) in text
