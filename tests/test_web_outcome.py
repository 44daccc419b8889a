"""The outcome up front: the verdict banner and figures from the eval and vocab stages' own lines,
the history across pipeline runs, a finished pipeline said as finished (not "done at 06:48 (0s–0s)
in 0s"), and a ready service said as serving (not its weight-loading bar's ETA)."""

from __future__ import annotations

import re

import web_samples
from eaglelab.control.lab import Lab
from eaglelab.control.status import collect
from status_web import create_app, model
from status_web.outcome import OutcomeReader, parse_coverage, parse_eval
from web_lab import make_conf, make_run_dir

NOW = web_samples.NOW


def eval_log(rate=0.0833, mal=1.25, pos=(0.2, 0.04, 0.01), speedup=0.46, verdict="SLOWER", spec=11.4, base=24.8,
             reasons=("speculative serving is 0.46x the baseline's speed", "mean acceptance length 1.25 < 1.5")) -> bytes:
    """What py/eaglelab/stages/eval.py prints at its end (the same f-strings)."""
    p = ", ".join(f"{x:.2f}" for x in pos)
    lines = [f"eval: acceptance rate {rate:.1%}, mean acceptance length {mal:.2f}, per position [{p}] (48 drafts)",
             f"eval: {spec:.1f} tokens/s with the drafter vs {base:.1f} without: speedup {speedup:.2f}x; 3/8 outputs "
             "identical to the baseline's",
             f"eval summary: acceptance_rate={rate:.4f} mean_acceptance_length={mal:.3f} speedup={speedup:.3f} "
             f"verdict={verdict}"]
    if verdict in ("SLOWER", "LOW_ACCEPTANCE"):
        lines += ["!" * 78, f"!!! VERDICT: {verdict}: " + "; ".join(reasons), "!!! Check: aux layer ids", "!" * 78]
    else:
        lines += [f"eval: VERDICT {verdict}: " + "; ".join(reasons)]
    return ("\n".join(lines) + "\n").encode()


def test_parse_eval_and_coverage_lines():
    figs = parse_eval(eval_log().decode())
    assert figs["verdict"] == "SLOWER" and figs["speedup"] == 0.46 and figs["acceptance_rate"] == 0.0833
    assert figs["mean_acceptance_length"] == 1.25 and figs["per_position"] == [0.2, 0.04, 0.01]
    assert figs["drafts"] == 48 and (figs["spec_tokens_per_s"], figs["baseline_tokens_per_s"]) == (11.4, 24.8)
    assert figs["reasons"] == ["speculative serving is 0.46x the baseline's speed", "mean acceptance length 1.25 < 1.5"]
    assert parse_eval("eval: 3 requests\n") is None
    assert parse_coverage("vocab coverage: 98.3% of 1200 supervised tokens with 512 of 2048 ids\n") == 0.983


def test_outcome_from_real_run_directories(tmp_path, monkeypatch):
    """A lab whose eval ran twice (SLOWER, then PAYS) and vocab once: the banner is the latest eval,
    the history has both, newest first; each finished log is read once."""
    monkeypatch.delenv("EAGLELAB_TOKEN", raising=False)
    lab = Lab.load(str(make_conf(tmp_path)))
    work = tmp_path / "work"
    make_run_dir(work, "vocab-20270115T060000-0001", stage="vocab",
                 log=b"vocab coverage: 97.5% of 4000 supervised tokens\n",
                 started_at="2027-01-15T06:00:00.000Z", ended_at="2027-01-15T06:01:00.000Z")
    make_run_dir(work, "eval-20270115T061000-0001", stage="eval", log=eval_log(), exit_code=0,
                 started_at="2027-01-15T06:10:00.000Z", ended_at="2027-01-15T06:12:00.000Z")
    make_run_dir(work, "eval-20270115T071000-0002", stage="eval", exit_code=0,
                 log=eval_log(rate=0.61, mal=2.84, pos=(0.8, 0.6, 0.43), speedup=1.72, verdict="PAYS",
                              reasons=("speedup 1.72x",)),
                 started_at="2027-01-15T07:10:00.000Z", ended_at="2027-01-15T07:14:00.000Z")
    reader = OutcomeReader(lab)
    status = reader(collect(lab).to_json())
    o = status["outcome"]
    assert o["verdict"] == "FASTER" and o["eval_verdict"] == "PAYS" and o["speedup"] == 1.72
    assert o["coverage"] == 0.975 and o["eval_run"] == "eval-20270115T071000-0002"
    assert [h["verdict"] for h in o["history"]] == ["FASTER", "SLOWER"]
    assert set(reader.parsed) == {"vocab-20270115T060000-0001", "eval-20270115T061000-0001",
                                  "eval-20270115T071000-0002"}
    log = work / "runs" / "eval-20270115T071000-0002" / "output.log"
    kept = log.read_bytes()
    log.write_bytes(b"rewritten\n")
    assert reader(collect(lab).to_json())["outcome"]["verdict"] == "FASTER"  # finished logs are not read again
    log.write_bytes(kept)

    app = create_app(lab, start=False, clock=lambda: NOW)
    app.extensions["eaglelab"].snapshot.refresh_now()
    html = app.test_client().get("/").get_data(as_text=True)
    assert re.search(r'<span class="vword" id="verdict">FASTER</span>', html)
    for shown in ("1.72×", "61.0%", "2.84", "1: 80%", "97.5%", "Across pipeline runs", "SLOWER"):
        assert shown in html, shown


def test_not_measured_says_why():
    status = web_samples.lab_status()
    status["outcome"] = {"verdict": "NOT MEASURED", "reasons": ["eval has not run yet"], "measured": False,
                         "history": [], "finished_at": None}
    html = create_app(source=lambda: web_samples.copy_of(status), start=False, clock=lambda: NOW)
    html.extensions["eaglelab"].snapshot.refresh_now()
    page = html.test_client().get("/").get_data(as_text=True)
    assert 'id="verdict">NOT MEASURED<' in page and "eval has not run yet" in page


def test_a_finished_pipeline_says_when_and_how_long_not_an_eta_in_the_past():
    status = web_samples.lab_status()
    for r in status["runs"]:
        if r["state"] == "running":
            r.update(state="completed", exit_code=0, ended_at=web_samples.iso(-120), duration_s=600.0)
    for s in status["stages"]:
        s["state"] = "completed" if s.get("latest_run") else s["state"]
    status["pipeline"] = {"finish_at": web_samples.iso(-120), "finish_low_at": web_samples.iso(-120),
                          "finish_high_at": web_samples.iso(-120)}
    from status_web.outcome import finished
    status["outcome"] = {"verdict": "SLOWER", "measured": True, "speedup": 0.5, **finished(status)}
    ov = model.overview(status, NOW)
    assert ov["pipeline"] is None and not ov["busy"]
    app = create_app(source=lambda: web_samples.copy_of(status), start=False, clock=lambda: NOW)
    app.extensions["eaglelab"].snapshot.refresh_now()
    page = app.test_client().get("/").get_data(as_text=True)
    assert "Pipeline done at" not in page and "0s–0s" not in page
    assert re.search(r"Pipeline finished at <b id=\"finished-at\">\d\d:\d\d</b>, took <b id=\"took\">\d", page)


def test_a_ready_service_shows_serving_not_its_loading_eta():
    stage = {"name": "serve_eval", "host": "gpu1", "kind": "service", "state": "running"}
    run = {"id": "serve_eval-1", "state": "running", "started_at": web_samples.iso(-3600),
           "log_state": {"ready": True, "progress": {"n": 4, "total": 4, "eta_s": 0.0, "unit": "it"},
                         "phases": [{"name": "weights_loading", "duration_s": 60.0},
                                    {"name": "engine_init", "duration_s": 60.0}, {"name": "serving"}],
                         "metrics": {"vllm/gen_tokens_per_s": [[0, 5.0], [0, 31.5]], "vllm/running_reqs": [[0, 3.0]]}}}
    c = model.cell(stage, run, {}, NOW)
    assert c["progress"] is None and c["eta"] is None
    assert c["service"]["for"] == "58m 00s" and "31.5 tokens/s generated" in c["service"]["load"]
    assert "3 requests running" in c["service"]["load"]
    loading = {**run, "log_state": {**run["log_state"], "ready": False}}
    assert model.cell(stage, loading, {}, NOW)["service"] is None  # still loading: bar and ETA as before


def test_train_page_leads_with_loss_and_per_position_accuracy():
    status = web_samples.lab_status()
    train = next(r for r in status["runs"] if r["id"] == "train-20270114T200000-cccc")
    train["log_state"] = {**(train.get("log_state") or {}), "metrics": {
        "lr": [[0, 1e-3], [10, 1e-3]], "profile/tokens_per_s": [[0, 1200.0], [10, 1300.0]],
        "train/full_acc_1": [[0, 0.1], [10, 0.3]], "train/full_acc_0": [[0, 0.2], [10, 0.5]],
        "train/loss": [[0, 3.0], [10, 1.5]], "val/loss_epoch": [[0, 2.0]], "epoch": [[0, 0.0]]}}
    app = create_app(source=lambda: web_samples.copy_of(status), start=False, clock=lambda: NOW)
    app.extensions["eaglelab"].snapshot.refresh_now()
    page = app.test_client().get("/runs/train-20270114T200000-cccc").get_data(as_text=True)
    plots = re.findall(r"<figcaption>([\w/]+):", page)
    assert plots == ["train/loss", "train/full_acc_0", "train/full_acc_1", "profile/tokens_per_s"]
    table = page.split('id="metrics-last"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<td>([\w/]+)</td><td>([^<]+)</td>", table)
    assert [n for n, _ in rows][:3] == ["train/loss", "train/full_acc_0", "train/full_acc_1"]
    assert {"lr", "val/loss_epoch", "epoch"} <= {n for n, _ in rows}  # constants: rows, not plots
    assert dict(rows)["train/loss"] == "1.5"
    assert '<a href="/stages/train">train</a>' in page


def test_hosts_page_shows_gpu_holders_load_and_disk():
    status = web_samples.lab_status()
    extract = next(r for r in status["runs"] if r["state"] == "running")
    status["hosts"][0].update(load=[3.5, 2.25, 1.0], gpus=[
        {"index": 0, "name": "NVIDIA H100", "utilization_pct": 97.0, "memory_used_mib": 70000,
         "memory_total_mib": 81559, "uuid": "GPU-a", "runs": [extract["id"]], "other_processes": 1},
        {"index": 1, "name": "NVIDIA H100", "utilization_pct": 0.0, "memory_used_mib": 1,
         "memory_total_mib": 81559, "uuid": "GPU-b", "runs": [], "other_processes": 0}])
    app = create_app(source=lambda: web_samples.copy_of(status), start=False, clock=lambda: NOW)
    app.extensions["eaglelab"].snapshot.refresh_now()
    page = app.test_client().get("/hosts").get_data(as_text=True)
    gpu0 = page.split('data-gpu="0"', 1)[1].split("</tr>", 1)[0]
    assert f'href="/runs/{extract["id"]}"' in gpu0 and "1 process of no run" in gpu0 and "97%" in gpu0
    assert "free" in page.split('data-gpu="1"', 1)[1].split("</tr>", 1)[0]
    assert "3.50 · 2.25 · 1.00" in page and "500.0 GiB" in page
    assert "No route to host" in page


def test_hostside_names_the_run_holding_each_gpu(tmp_path, monkeypatch):
    """hostside.report on a host whose nvidia-smi (a stand-in: no GPU here) lists a compute process
    of a real running process group: the run is named on that GPU, a stray pid is counted apart."""
    import os
    import subprocess
    import sys

    from eaglelab.host import hostside, machine
    stage = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        smi = tmp_path / "bin" / "nvidia-smi"
        smi.parent.mkdir()
        smi.write_text("#!/bin/sh\ncase \"$1\" in\n"
                       "  --query-gpu=*) echo '0, NVIDIA H200, 88, 70000, 143771, GPU-aaa'; "
                       "echo '1, NVIDIA H200, 0, 1, 143771, GPU-bbb';;\n"
                       f"  --query-compute-apps=*) echo 'GPU-aaa, {stage.pid}'; echo 'GPU-aaa, {os.getpid()}';;\n"
                       "esac\n")
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
        devices = machine.gpus()
        machine.mark_gpu_holders(devices, [{"id": "extract-1", "state": "running", "pgid": stage.pid},
                                            {"id": "old-1", "state": "completed", "pgid": os.getpgid(0)}])
        assert devices[0]["runs"] == ["extract-1"] and devices[0]["other_processes"] == 1
        assert devices[1]["runs"] == [] and devices[1]["other_processes"] == 0
        assert devices[0]["uuid"] == "GPU-aaa" and devices[0]["utilization_pct"] == 88.0
        rep = hostside.report(str(tmp_path / "work"))
        assert len(rep["load"]) == 3 and rep["gpus"][0]["runs"] == []  # no runs in that work_dir
    finally:
        stage.kill()
        stage.wait()


def sweep_log() -> bytes:
    """The end of a sweep eval's log: the table as stages/eval.py prints it, then the decided cell."""
    from eaglelab.stages import eval as eval_stage

    def cell(tps, drafts=None):
        runs = [{"completed": 8, "output_tokens": 512, "tokens_per_s": t, "tpot_ms_median": 5.0, "tpot_ms_p99": 6.0,
                 "itl_ms_median": 5.0, "itl_ms_p99": 6.0, "ttft_ms_median": 1.0, "texts": ["a"] * 8,
                 **({"drafts": drafts, "draft_tokens": 3 * drafts, "accepted_tokens": drafts,
                     "per_position": [0.5, 0.3, 0.2]} if drafts else {})} for t in (tps, tps * 1.1)]
        return eval_stage.aggregate(runs)
    rows = []
    for sampling, conc, base, spec in (("greedy", 1, 20.0, 30.0), ("greedy", 4, 60.0, 45.0), ("sampled", 1, 20.0, 26.0),
                                       ("sampled", 4, 60.0, 40.0)):
        b, s = cell(base), cell(spec, drafts=40)
        rows.append({"sampling": sampling, "concurrency": conc, "baseline": b, "spec": s,
                     "comparison": eval_stage.compare(b, s, sampling)})
    text = "\n".join(["eval sweep (8 requests x 64 tokens per cell, 2 repeat(s); mean [min-max]):",
                      eval_stage.table(rows), eval_log(speedup=0.75, verdict="SLOWER").decode().rstrip()])
    return text.replace("verdict=SLOWER", "verdict=SLOWER concurrency=4 sampling=greedy").encode()


def test_sweep_table_and_decided_concurrency_reach_the_banner(tmp_path, monkeypatch):
    figs = parse_eval(sweep_log().decode())
    assert figs["decided_at"] == {"concurrency": 4, "sampling": "greedy"} and figs["verdict"] == "SLOWER"
    assert [(r["sampling"], r["concurrency"]) for r in figs["sweep"]] == [("greedy", 1), ("greedy", 4),
                                                                          ("sampled", 1), ("sampled", 4)]
    g1 = figs["sweep"][0]
    assert g1["speedup"] == 1.5 and g1["verdict"] == "PAYS" and g1["same"] == "8/8" and abs(g1["acceptance_rate"] - 0.333) < 1e-9
    assert figs["sweep"][1]["verdict"] == "SLOWER" and figs["sweep"][2]["same"] is None
    assert parse_eval(eval_log().decode())["sweep"] == []  # an eval of before the sweep still reads

    monkeypatch.delenv("EAGLELAB_TOKEN", raising=False)
    lab = Lab.load(str(make_conf(tmp_path)))
    make_run_dir(tmp_path / "work", "eval-20270115T061000-0001", stage="eval", log=sweep_log(), exit_code=0,
                 started_at="2027-01-15T06:10:00.000Z", ended_at="2027-01-15T06:12:00.000Z")
    app = create_app(lab, start=False, clock=lambda: NOW)
    app.extensions["eaglelab"].snapshot.refresh_now()
    html = app.test_client().get("/").get_data(as_text=True)
    assert re.search(r'id="o-decided">concurrency 4, greedy<', html) and 'id="o-sweep"' in html
    for shown in ("1.50×", "0.75×", "31.5 vs 21.0", "8/8", "PAYS", "sampled"):
        assert shown in html, shown
