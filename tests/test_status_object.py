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


# -- the other blocks, typed: host facts, forecast, side jobs, outcome, config, preflight, Slurm ---------

def _blocks_doc() -> dict:
    doc = web_samples.lab_status()
    doc["hosts"][0].update(load=[1.5, 0.75, 0.2], gpus=[{"index": 0, "name": "H100", "utilization_pct": 97.0,
                                                         "memory_used_mib": 70000, "memory_total_mib": 81559,
                                                         "runs": [EXTRACT], "other_processes": 2}, "junk"])
    doc["pipeline"].update(
        forecast={"source": "eval", "acceptance_rate": 0.61, "speedup": 1.72, "verdict": "PAYS", "checkpoints": 2,
                  "made_at": web_samples.iso(-900), "decoding": "sampled", "reasons": ["speedup 1.72x"],
                  "offline": {"acceptance_rate": 0.58, "sampled": {"acceptance_rate": 0.52}},
                  "served_checkpoint": {"acceptance_rate": 0.5, "epoch": 3, "run": "smoke-1"}},
        forecast_history=[{"train_run": "train-1", "forecast_rate": 0.6, "decoding": "sampled",
                           "forecast_greedy_rate": 0.62, "greedy_error": -0.01}, 7],
        side_jobs=[{"stage": "engine_check", "run": "engine_check-1", "state": "failed", "current_config": True,
                    "engine": {"served_rate": 0.1, "offline_rate": 0.5, "ratio": 0.2, "min_ratio": 0.8, "drafts": 120,
                               "alarm": True}}])
    doc["outcome"] = {"verdict": "FASTER", "measured": True, "speedup": 1.72, "per_position": [0.8, "x", 0.4],
                      "decided_at": {"concurrency": 4, "sampling": "greedy"}, "finished_at": NOW - 100,
                      "sweep": [{"sampling": "greedy", "concurrency": 1, "speedup_min": 1.6, "same": "64/64"}, 3],
                      "history": [{"run_id": "eval-1", "ended_at": web_samples.iso(-100), "speedup": "fast"}]}
    doc["config"] = {"conf_dir": "/lab/conf", "reloaded": None,
                     "error": {"at": web_samples.iso(-5), "files": ["/lab/conf/lab.yaml"], "message": "bad key"}}
    doc["runs"][2]["preflight"] = {"cuda": True, "ram": {"ok": False, "detail": "low"}, "odd": {"ok": "yes"}}
    doc["runs"][1]["slurm"] = {"job_id": 1234, "state": "RUNNING", "queue_position": 3, "queued_s": "long"}
    return doc


def test_every_block_of_the_document_is_read_typed_once_and_written_back_as_it_came():
    doc = _blocks_doc()
    st = Status.from_json(copy.deepcopy(doc), NOW)
    gpu1 = st.host("gpu1")
    assert gpu1.load == (1.5, 0.75, 0.2) and [g.runs for g in gpu1.gpus] == [(EXTRACT,)]  # "junk" is no GPU
    assert gpu1.gpus[0].other_processes == 2 and st.host("gpu2").gpus is None and st.host("gpu2").reachable is False
    fc = st.forecast
    assert (fc.acceptance_rate, fc.checkpoints, fc.made_at, fc.offline.sampled.acceptance_rate) == (
        0.61, 2, NOW - 900, 0.52)
    assert fc.served_checkpoint.epoch == "3" and fc.mean_acceptance_length is None
    (check,) = st.forecast_history
    assert check.other == "greedy" and check.by_decoding["greedy"] == (0.62, None, -0.01)
    (job,) = st.side_jobs
    assert job.engine.ratio == 0.2 and job.engine.alarm and job.current_config
    out = st.outcome
    assert out.per_position == (0.8, 0.4) and out.decided_at == (4, "greedy") and out.finished_at == NOW - 100
    assert [c.speedup_min for c in out.sweep] == [1.6] and out.history[0].speedup is None
    assert st.config.error.files == ("/lab/conf/lab.yaml",) and st.config.reloaded is None
    pre = st.run("train-20270114T200000-cccc").preflight
    assert [(c.check, c.verdict) for c in pre] == [("cuda", "PASS"), ("ram", "FAIL"), ("odd", "?")]
    sl = st.run(EXTRACT).slurm
    assert (sl.job_id, sl.queue_position, sl.queued_s) == ("1234", 3, None)
    for typed, raw in ((fc, doc["pipeline"]["forecast"]), (job, doc["pipeline"]["side_jobs"][0]),
                       (out, doc["outcome"]), (st.config, doc["config"]), (gpu1, doc["hosts"][0])):
        assert typed.to_json() == raw  # the document as it came: the edges write that
    assert st.to_json() == doc


GARBAGE = (None, True, 3, -1.5, float("nan"), "x", "", [], [1, "a", None], {}, {"x": [1]})


def test_a_garbled_block_reads_as_absent_never_as_a_crash():
    """Every field of every block, each garbage value in turn: the readers never raise."""
    from eaglelab.host_status import HostStatus
    from eaglelab.pipeline_status import ConfigNote, Forecast, ForecastCheck, Outcome, SideJob
    from eaglelab.run_details import PreflightCheck, SlurmJob
    doc = _blocks_doc()
    blocks = [(HostStatus.from_json, doc["hosts"][0]), (HostStatus.from_json, doc["hosts"][0]["gpus"][0]),
              (Forecast.from_json, doc["pipeline"]["forecast"]), (ForecastCheck.from_json, {"decoding": "x"}),
              (SideJob.from_json, doc["pipeline"]["side_jobs"][0]),
              (SideJob.from_json, doc["pipeline"]["side_jobs"][0]["engine"]),
              (Outcome.from_json, doc["outcome"]), (Outcome.from_json, doc["outcome"]["sweep"][0]),
              (Outcome.from_json, doc["outcome"]["history"][0]), (ConfigNote.from_json, doc["config"]),
              (ConfigNote.from_json, doc["config"]["error"]), (PreflightCheck.all_from_json, {"a": {"ok": True}}),
              (SlurmJob.from_json, doc["runs"][1]["slurm"])]
    for read, good in blocks:
        for key in good:
            for bad in GARBAGE:
                read({**good, key: bad})
                for nested in ("engine", "offline", "decided_at", "error", "sweep", "gpus"):
                    if isinstance(good.get(nested), (dict, list)):
                        read({**good, nested: {key: bad} if isinstance(good[nested], dict) else [{key: bad}]})
        for bad in GARBAGE:
            read(bad)
    assert Forecast.from_json({"acceptance_rate": "high"}).acceptance_rate is None
    assert HostStatus.from_json({"name": "h", "load": [1, "2", 3], "reachable": "yes"}).load is None
    page = model.overview(Status.from_json({**doc, "outcome": "garbled", "pipeline": {"side_jobs": "x"}}, NOW), NOW)
    assert page["outcome"]["verdict"] == "NOT MEASURED" and page["side_jobs"] == []
