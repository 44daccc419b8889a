"""The status page through Flask's test client: every route, the JSON schema, escaping, tokens,
path traversal, odd records. Two kinds of app: one over a fixed status object (web_samples, the
seeds' pipeline mid-run) and one over a real temporary lab (real run directories, real `tick`)."""

from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from prometheus_client.parser import text_string_to_metric_families

import web_samples
from eaglelab.control.lab import Lab
from eaglelab.control.status import collect
from eaglelab.lab_status import StageStatus
from eaglelab.logstate import Finish
from status_web import create_app, model
from status_web.snapshot import mark_state_files
from web_lab import make_conf, make_run_dir

EXTRACT = "extract-20270115T063000-bbbb"
TRAIN = "train-20270114T200000-cccc"


def sample_app(status=None, **kw):
    status = status or web_samples.lab_status()
    app = create_app(source=lambda: web_samples.copy_of(status), start=False, clock=lambda: web_samples.NOW, **kw)
    app.extensions["eaglelab"].snapshot.refresh_now()
    return app


@pytest.fixture
def client():
    return sample_app().test_client()


@pytest.fixture
def lab(tmp_path, monkeypatch):
    monkeypatch.delenv("EAGLELAB_TOKEN", raising=False)
    return Lab.load(str(make_conf(tmp_path)))


def lab_app(lab, **kw):
    app = create_app(lab, start=False, **kw)
    app.extensions["eaglelab"].snapshot.refresh_now()
    return app


def text(resp) -> str:
    return resp.get_data(as_text=True)


# -- /api/status -------------------------------------------------------------------------------

def test_api_status_is_collect_plus_web(lab, tmp_path):
    make_run_dir(tmp_path / "work", "tick-20270115T070000-0001", log=b"tick: done\n")
    resp = lab_app(lab).test_client().get("/api/status")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    body = resp.get_json()
    direct = collect(lab, refresh=False).to_json()
    assert body["schema"] == 1
    assert set(direct) <= set(body)
    assert [r["id"] for r in body["runs"]] == [r["id"] for r in direct["runs"]] == ["tick-20270115T070000-0001"]
    run = body["runs"][0]
    for key in ("id", "stage", "host", "state", "exit_code", "signal", "started_at", "ended_at"):
        assert key in run
    assert run["state"] == "completed" and run["log_state_status"] == "missing"
    drop_eta = lambda d: {k: v for k, v in d.items() if k != "eta"}  # relative to each one's now
    assert drop_eta(body["stages"][0]) == drop_eta(direct["stages"][0])
    assert body["hosts"][0]["name"] == "local" and body["hosts"][0]["reachable"] is True
    assert body["web"]["refresh_error"] is None


def test_api_status_etag_and_not_ready():
    app = create_app(source=web_samples.lab_status, start=False)
    c = app.test_client()
    first = c.get("/api/status")
    assert first.status_code == 503 and first.headers["Retry-After"]
    assert "first status refresh" in first.get_json()["error"]
    app.extensions["eaglelab"].snapshot.refresh_now()
    ok = c.get("/api/status")
    assert ok.status_code == 200
    again = c.get("/api/status", headers={"If-None-Match": ok.headers["ETag"]})
    assert again.status_code == 304


def test_failed_refresh_keeps_last_snapshot_and_says_so():
    calls = {"n": 0}

    def source():
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("ssh master died")
        return web_samples.lab_status()

    app = create_app(source=source, start=False, clock=lambda: web_samples.NOW)
    snap = app.extensions["eaglelab"].snapshot
    snap.refresh_now()
    snap.refresh_now()
    c = app.test_client()
    body = c.get("/api/status").get_json()
    assert body["web"]["refresh_error"] == "RuntimeError: ssh master died"
    assert [r["id"] for r in body["runs"]][1] == EXTRACT
    assert "last refresh failed" in text(c.get("/")) and "ssh master died" in text(c.get("/"))


# -- pages -------------------------------------------------------------------------------------

def test_overview_shows_cells_eta_failure_and_escapes(client):
    resp = client.get("/")
    assert resp.status_code == 200
    html = text(resp)
    cell = re.search(r'<div class="cell st-running" data-stage="extract".*?</div>\s*</div>', html, re.S).group(0)
    assert "weights_loading" in cell
    assert '<progress value="55" max="64">' in cell and "55</b>/64 shard" in cell
    clock = time.strftime("%H:%M", time.localtime(web_samples.NOW + 420))
    low = time.strftime("%H:%M", time.localtime(web_samples.NOW + 350))
    high = time.strftime("%H:%M", time.localtime(web_samples.NOW + 520))
    assert f"ETA <b>{clock}</b>" in cell and f"({low}–{high})" in cell
    assert 'data-stage="train" data-state="unreachable"' in html
    assert "cuda_oom" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert" not in html
    assert 'data-stage="vocab" data-state="pending"' in html
    finish = time.strftime("%H:%M", time.localtime(web_samples.NOW + 4 * 3600))
    assert f'<b id="pipeline-finish">{finish}</b>' in html


def test_rate_plot_shows_the_seeds_drift(client):
    html = text(client.get("/"))
    svg = re.search(r'<figure class="plot" data-run="extract-[^"]+">(<svg.*?</svg>)', html, re.S).group(1)
    first, last = float(re.search(r'data-first-y="([\d.]+)"', svg).group(1)), \
        float(re.search(r'data-last-y="([\d.]+)"', svg).group(1))
    assert 15 <= first <= 18 and 27 <= last <= 30  # 16 -> 29 s/shard, as the seeds' load drifted
    assert "s/shard" in svg


def test_timeline_has_done_running_and_predicted(client):
    html = text(client.get("/"))
    gantt = re.search(r'<svg class="gantt".*?</svg>', html, re.S).group(0)
    assert 'class="seg completed"' in gantt and 'class="seg running"' in gantt
    assert gantt.count('class="seg predicted"') == 2  # extract's rest and vocab
    assert 'class="seg failed"' in gantt  # train's last run, though its host is unreachable now
    assert "pipeline done" in gantt


def test_partial_is_only_the_live_part(client):
    html = text(client.get("/?partial=1"))
    assert "<html" not in html and 'data-stage="extract"' in html


def test_run_page_metrics_phases_and_failure(client):
    html = text(client.get(f"/runs/{TRAIN}"))
    assert "train/loss" in html and "train/acc" in html and html.count('<svg class="chart"') == 2
    assert "failed: exit code 1" in html
    assert "&lt;script&gt;" in html and "<script>alert" not in html
    assert client.get("/stages/train").headers["Location"].endswith(f"/runs/{TRAIN}")


def test_hosts_page(client):
    html = text(client.get("/hosts"))
    assert "NVIDIA H100" in html and "97%" in html and "68.4 / 79.6 GiB" in html
    assert "No route to host" in html and "unreachable" in html


def test_unknown_things_are_404(client):
    assert client.get("/runs/nope").status_code == 404
    assert client.get("/stages/nope").status_code == 404
    assert client.get("/api/runs/nope").get_json() == {"error": "no run 'nope'"}


def test_log_tail_escaped_and_state_files(lab, tmp_path):
    work = tmp_path / "work"
    make_run_dir(work, "tick-20270115T070000-0001",
                 log=b"start\nTicking:  50%|#####     | 1/2 [00:01<00:01]\rTicking: 100%|##########| 2/2\n"
                     b"\x1b[0;31m<script>alert('x')</script>\x1b[0m\n\xff\xfe bad utf8\n",
                 state_json=b'{"schema": 1, "state": "comp')  # half-written
    make_run_dir(work, "tick-20270115T071000-0002", log=b"", exit_code=1)
    c = lab_app(lab).test_client()
    html = text(c.get("/runs/tick-20270115T070000-0001"))
    log = re.search(r'<pre class="log" id="log">(.*?)</pre>', html, re.S).group(1)
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in log and "<script>alert" not in html
    assert "Ticking: 100%" in log and "50%" not in log  # a \r frame shows its last state
    assert "\x1b" not in log and "\ufffd\ufffd bad utf8" in log
    assert "state file unreadable (half-written?)" in html
    assert "no state file yet" in text(c.get("/runs/tick-20270115T071000-0002"))
    api = c.get("/api/runs/tick-20270115T070000-0001").get_json()
    assert api["log_tail"][-1].endswith("bad utf8") and api["run"]["log_state_status"] == "unreadable"


def test_mark_state_files(tmp_path):
    d = tmp_path / "r1"
    d.mkdir()
    status = {"runs": [{"host": "local", "run_dir": str(d), "log_state": None},
                       {"host": "far", "run_dir": str(d), "log_state": None},
                       {"host": "local", "run_dir": str(d), "log_state": {"state": "running"}}]}
    mark_state_files(status, {"local"})
    assert [r["log_state_status"] for r in status["runs"]] == ["missing", None, "ok"]
    (d / "state.json").write_text("{")
    mark_state_files(status, {"local"})
    assert status["runs"][0]["log_state_status"] == "unreadable"


@pytest.mark.parametrize("path", [
    "/runs/..%2F..%2F..%2Fetc%2Fpasswd", "/runs/../../etc/passwd", "/api/runs/..%2Fmeta.json",
    "/static/..%2F..%2Fconf%2Flab.yaml", "/static/../app.py", "/static/%2e%2e/app.py",
    "/runs/%2Fetc%2Fpasswd", "/stages/..%2F..", "//etc/passwd",
])
def test_no_path_from_a_url_reaches_the_filesystem(client, path):
    resp = client.get(path)
    # the test client reads "//etc/passwd" as host "etc": refused by the Host check before routing
    assert resp.status_code == (421 if path.startswith("//") else 404)
    body = text(resp)
    assert "root:" not in body and "import" not in body and "hosts:" not in body


def test_static_assets_are_shipped():
    c = sample_app().test_client()
    assert "poll" in text(c.get("/static/live.js"))
    assert ".cell" in text(c.get("/static/style.css"))
    assert "cdn" not in text(c.get("/")).lower()


# -- /metrics ----------------------------------------------------------------------------------

def metrics_of(c) -> dict:
    out = {}
    for fam in text_string_to_metric_families(text(c.get("/metrics"))):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics(client):
    m = metrics_of(client)
    ex = (("host", "gpu1"), ("stage", "extract"))
    assert m[("eaglelab_stage_progress_ratio", ex)] == pytest.approx(55 / 64)
    assert m[("eaglelab_stage_eta_seconds", ex)] == pytest.approx(420)
    assert m[("eaglelab_stage_state", ex + (("state", "running"),))] == 1.0
    assert m[("eaglelab_stage_state", ex + (("state", "failed"),))] == 0.0
    assert m[("eaglelab_stage_state", (("host", "gpu2"), ("stage", "train"), ("state", "unreachable")))] == 1.0
    synth = (("host", "gpu1"), ("stage", "synth"))
    assert m[("eaglelab_run_last_success_timestamp_seconds", synth)] == pytest.approx(web_samples.NOW - 2.5 * 3600)
    assert m[("eaglelab_host_up", (("host", "gpu2"),))] == 0.0


def test_metrics_cardinality_is_bounded_by_stages_not_runs():
    status = web_samples.lab_status()
    base = len(metrics_of(sample_app(status).test_client()))
    old = status["runs"][0]
    status["runs"] += [{**old, "id": f"synth-old-{i}"} for i in range(200)]
    assert len(metrics_of(sample_app(status).test_client())) == base


# -- tokens and actions ------------------------------------------------------------------------

def test_actions_disabled_without_a_token(lab):
    c = lab_app(lab).test_client()
    resp = c.post("/api/stages/tick/rerun", headers={"Authorization": "Bearer anything"})
    assert resp.status_code == 403 and "disabled" in resp.get_json()["error"]
    assert c.post("/api/runs/x/stop").status_code == 403
    assert lab.registry.runs() == []  # nothing happened
    assert "button" not in text(c.get("/"))


def test_actions_need_the_right_token(lab):
    c = lab_app(lab, token="s3cret").test_client()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                    {"Authorization": "Basic czNjcmV0"}):
        resp = c.post("/api/stages/tick/rerun", headers=headers)
        assert resp.status_code == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert lab.registry.runs() == []
    assert c.post("/api/stages/nope/rerun", headers={"Authorization": "Bearer s3cret"}).status_code == 404


def test_rerun_then_stop_a_real_tick(lab):
    app = lab_app(lab, token="s3cret")
    c = app.test_client()
    auth = {"Authorization": "Bearer s3cret"}
    resp = c.post("/api/stages/tick/rerun", headers=auth)
    assert resp.status_code == 200, resp.get_json()
    run = resp.get_json()["run"]
    assert run["stage"] == "tick" and run["state"] in ("running", "pending")
    app.extensions["eaglelab"].snapshot.refresh_now()
    assert 'data-stage="tick" data-state="running"' in text(c.get("/"))
    assert c.post(f"/api/runs/{run['id']}/stop", headers={"Authorization": "Bearer nope"}).status_code == 401
    stopped = c.post(f"/api/runs/{run['id']}/stop", headers=auth)
    assert stopped.status_code == 200 and stopped.get_json()["run"]["state"] == "killed"
    app.extensions["eaglelab"].snapshot.refresh_now()
    again = c.post(f"/api/runs/{run['id']}/stop", headers=auth)
    assert again.status_code == 409


def test_read_token_option():
    app = sample_app(token="s3cret", read_token=True)
    c = app.test_client()
    for path in ("/", "/api/status", "/metrics", f"/runs/{TRAIN}", "/hosts"):
        assert c.get(path).status_code == 401
        assert c.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert c.get("/healthz").status_code == 200 and c.get("/static/style.css").status_code == 200
    swap = c.get("/hosts?token=s3cret")
    assert swap.status_code == 302 and swap.headers["Location"].endswith("/hosts")
    assert "HttpOnly" in swap.headers["Set-Cookie"]
    assert c.get("/hosts").status_code == 200  # the cookie now
    assert app.test_client().get("/?token=wrong").status_code == 401  # a fresh browser, no cookie


# -- odd records never take the page down -------------------------------------------------------

json_values = hs.recursive(hs.none() | hs.booleans() | hs.integers() | hs.floats() | hs.text(max_size=20),
                           lambda kids: hs.lists(kids, max_size=4) | hs.dictionaries(hs.text(max_size=8), kids,
                                                                                      max_size=4), max_leaves=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=hs.sampled_from(["log_state", "progress", "history", "metrics", "failure", "phases", "eta",
                              "started_at", "duration_s", "state", "gpus", "pipeline", "stage_eta"]),
       value=json_values)
def test_any_odd_value_in_one_record_is_not_a_500(field, value):
    status = web_samples.lab_status()
    run = status["runs"][1]
    if field in ("progress", "phases", "metrics", "failure"):
        run["log_state"][field] = value
    elif field == "history":
        run["log_state"]["progress"]["history"] = value
    elif field == "gpus":
        status["hosts"][0]["gpus"] = value
    elif field == "pipeline":
        status["pipeline"] = value
    elif field == "stage_eta":
        status["stages"][2]["eta"] = value
    else:
        run[field] = value
    c = sample_app(status).test_client()
    for path in ("/", f"/runs/{EXTRACT}", "/hosts", "/metrics", "/api/status"):
        assert c.get(path).status_code == 200, (path, field, value)


# -- the pure parts ------------------------------------------------------------------------------

@pytest.mark.parametrize("samples,expected", [
    ([], []),
    ([(0, 0), (10, 1)], [(0.5, 10.0)]),
    ([(0, 0), (0, 3), (1, 5), (2, 10)], [(2.5, 0.2), (7.5, 0.2)]),  # whole-second clock: joined to span 1 s
    ([(0, 0), (16, 1), (33, 2), (60, 1), (90, 2)], [(0.5, 16.0), (1.5, 17.0), (1.5, 30.0)]),  # bar restarted
])
def test_seconds_per_item(samples, expected):
    got = model.seconds_per_item(samples)
    assert len(got) == len(expected)
    assert [v for p in got for v in p] == pytest.approx([v for p in expected for v in p])


@pytest.mark.parametrize("data,lines", [
    (b"a\nb\n", ["a", "b"]),
    (b"x: 10%\rx: 50%\rx: 100%\nnext", ["x: 100%", "next"]),
    (b"\x1b[32mgreen\x1b[0m\r\n", ["green"]),
    (b"\xff\n", ["\ufffd"]),
])
def test_log_tail(data, lines):
    assert model.log_tail(data) == lines


def test_finish_times_relative_and_absolute():
    """The page's finish times are the engine's, read by eaglelab.logstate.Finish (its one reader)."""
    fin = lambda eta, now: model.run_finish(None, StageStatus.from_json({"name": "s", "host": "h", "eta": eta}, now))
    assert fin({"eta_s": 10, "eta_low_s": 5, "eta_high_s": 20}, 100.0) == Finish(110.0, 105.0, 120.0)
    assert fin({"finish_at": "1970-01-01T00:02:00Z"}, 0.0) == Finish(120.0)
    assert fin({"finish_at": "garbage"}, 0.0) is None
    assert fin("x", 0.0) is None


def test_api_status_json_round_trips_through_the_snapshot():
    status = web_samples.lab_status()
    body = json.loads(sample_app(status).test_client().get("/api/status").get_data())
    body.pop("web")
    for r in body["runs"]:
        r.pop("log_state_status")
    assert body == json.loads(json.dumps(status))


def test_parser_history_feeds_the_rate_plot():
    """A vLLM-style shard load drifting 16 -> 29 s/shard, through the real parser (progress.history),
    fed frame by frame as the live tailer reads it."""
    from eaglelab.host.tail.whole import parse_chunks
    frames, t = [], 0.0
    for i in range(1, 65):
        t += 16 + 13 * (i - 1) / 63
        e = int(t)
        frames.append(f"Loading safetensors checkpoint shards: {100 * i // 64:3d}% Completed | {i}/64 "
                      f"[{e // 60:02d}:{e % 60:02d}<00:00, {16 + 13 * (i - 1) / 63:.2f}s/it]")
    state = parse_chunks([(f + "\r").encode() for f in frames] + [b"\n"])
    pts = model.seconds_per_item(model.bar_history(state))
    assert len(pts) >= 60
    assert 15 <= pts[0][1] <= 17.5 and 27.5 <= pts[-1][1] <= 30


def test_gzip_copies_are_the_same_documents(client):
    import gzip as gz
    plain = client.get("/api/status")
    packed = client.get("/api/status", headers={"Accept-Encoding": "gzip, deflate"})
    assert packed.headers["Content-Encoding"] == "gzip" and "Content-Encoding" not in plain.headers
    assert json.loads(gz.decompress(packed.get_data())) == plain.get_json()
    page = client.get("/", headers={"Accept-Encoding": "gzip"})
    assert gz.decompress(page.get_data()).decode() == text(client.get("/"))
    assert b"eaglelab_stage_state" in gz.decompress(client.get("/metrics", headers={"Accept-Encoding": "gzip"}).data)


def test_refresher_process_serves_the_same_pages(lab, tmp_path):
    """`lab web`'s mode: collect/JSON/gzip/pre-rendering in a child process, bytes sent back."""
    make_run_dir(tmp_path / "work", "tick-20270115T070000-0001", log=b"<b>bold?</b>\n")
    app = create_app(lab, refresher="process", start=False)
    snapshot = app.extensions["eaglelab"].snapshot
    try:
        assert snapshot.refresh_now() is not None and snapshot.error is None
        c = app.test_client()
        body = c.get("/api/status").get_json()
        assert [r["id"] for r in body["runs"]] == ["tick-20270115T070000-0001"]
        assert body["runs"][0]["log_state_status"] == "missing"
        assert ("overview.html", (), True) in snapshot.current.cache  # pre-rendered by the child
        assert 'data-stage="tick" data-state="completed"' in text(c.get("/"))
        assert "&lt;b&gt;bold?&lt;/b&gt;" in text(c.get("/runs/tick-20270115T070000-0001"))
        assert b"eaglelab_stage_state" in c.get("/metrics").data
        version = snapshot.current.version
        snapshot.refresh_now()
        assert snapshot.current.version > version
    finally:
        snapshot.stop()
    assert not snapshot._proc.is_alive()


def test_stalled_cell_says_why():
    status = web_samples.lab_status()
    status["stages"][1]["state"] = "stalled"
    status["runs"][1]["log_state"]["stall"] = {"reason": "no_progress", "idle_s": 900.0,
                                               "message": "no progress for 15 min (bar pace 28 s/shard)"}
    html = text(sample_app(status).test_client().get("/"))
    assert 'data-stage="extract" data-state="stalled"' in html
    assert "stalled: no progress for 15 min (bar pace 28 s/shard)" in html


def test_run_page_shows_preflight_when_the_record_has_it():
    status = web_samples.lab_status()
    status["runs"][2]["preflight"] = [
        {"name": "disk", "ok": True, "detail": "412 GiB free >= 38 GiB", "fix": ""},
        {"name": "env", "ok": False, "detail": "torch 2.13.0 != 2.12.1 <in lock>", "fix": "make sync HOST=gpu2"},
        {"name": "gpus", "ok": None, "detail": "nvidia-smi not found", "fix": ""}]
    html = text(sample_app(status).test_client().get(f"/runs/{TRAIN}"))
    assert "<b>PASS</b> disk: 412 GiB free" in html
    assert "<b>FAIL</b> env: torch 2.13.0 != 2.12.1 &lt;in lock&gt; <span class=\"muted\">— fix: make sync HOST=gpu2" in html
    assert "<b>WARN</b> gpus" in html


def test_a_big_lab_keeps_the_timeline_readable():
    status = web_samples.lab_status()
    done = status["runs"][0]
    for i in range(100):
        status["runs"].append({**done, "id": f"old-{i}", "stage": f"old-{i}"})
        status["stages"].insert(0, {"name": f"old-{i}", "host": "gpu1", "kind": "job", "depends_on": [],
                                    "latest_run": f"old-{i}", "state": "completed"})
    tl = model.timeline(status, web_samples.NOW)
    assert tl["hidden"] >= 100 and {"extract", "vocab", "train"} <= {r["stage"] for r in tl["rows"]}
    assert "finished stages off the critical path not shown" in text(sample_app(status).test_client().get("/"))


def test_a_host_never_contacted_is_shown_so_not_as_reachable(lab):
    app = lab_app(lab, ask_hosts=False)  # the registry only: nobody has asked the host
    c = app.test_client()
    host = c.get("/api/status").get_json()["hosts"][0]
    assert (host["contacted"], host["reachable"]) == (False, None)
    page = text(c.get("/hosts"))
    row = page[page.index('id="host-local"'):].split("</tr>")[0]
    assert "not contacted yet" in row and ">reachable<" not in row and ">unreachable<" not in row
    assert "eaglelab_host_up{" not in text(c.get("/metrics"))  # unknown is not down
    lab.refresh()
    app.extensions["eaglelab"].snapshot.refresh_now()
    assert ">reachable<" in text(c.get("/hosts"))


def test_overview_shows_the_forecast_its_source_age_and_past_errors():
    status = web_samples.lab_status()
    status["pipeline"] = {**(status.get("pipeline") or {}), "forecast": {
        "source": "checkpoint", "acceptance_rate": 0.156, "mean_acceptance_length": 1.468, "speedup": None,
        "verdict": "LOW_ACCEPTANCE", "reasons": ["acceptance rate 15.6% < 30%"], "checkpoints": 3,
        "run": "train-20270115T080000-cccc", "made_at": web_samples.iso(-90),
        "sampled": {"acceptance_rate": 0.121, "mean_acceptance_length": 1.363},
        "served_checkpoint": {"acceptance_rate": 0.183, "mean_acceptance_length": 1.549, "epoch": 2,
                              "run": "smoke-serve_eval-20270115T081500-eeee"}},
        "forecast_history": [{"train_run": "train-20270114T080000-dddd", "forecast_rate": 0.16, "eval_rate": 0.187,
                              "error": -0.027, "source": "checkpoint", "forecast_sampled_rate": 0.11,
                              "eval_sampled_rate": 0.125, "sampled_error": -0.015},
                             # served sampled (kimi-k2.5): the sampled triple leads, greedy's beside (#28 item 5)
                             {"train_run": "train-20270113T080000-ffff", "decoding": "sampled", "forecast_rate": 0.09,
                              "eval_rate": 0.08, "error": 0.01, "source": "pilot", "forecast_greedy_rate": 0.2,
                              "eval_greedy_rate": 0.17, "greedy_error": 0.03}]}
    html = text(sample_app(status).test_client().get("/"))
    box = re.search(r'<section class="forecast.*?</section>', html, re.S).group(0)
    assert 'id="forecast-verdict">LOW_ACCEPTANCE<' in box and 'id="f-acceptance">15.6%<' in box
    assert "the latest training checkpoint (offline)" in box and "3 checkpoint estimates" in box
    assert "1m 30s ago" in box, box
    served = re.search(r'served by vLLM, checkpoint 2</dt><dd id="f-served">(.*?)</dd>', box).group(1)
    assert served.startswith("18.3%, mean length 1.55") and "smoke-serve_eval-20270115T081500-eeee" in served
    assert "train-20270114T080000-dddd" in box and "-2.7 pts" in box
    assert 'id="f-sampled">12.1%, mean length 1.36<' in box  # the sampled forecast beside the greedy one
    assert "<td>greedy</td><td>16.0% (checkpoint)</td><td>18.7%</td><td>-2.7 pts</td>" in box
    assert "<td>11.0% (sampled)</td><td>12.5%</td><td>-1.5 pts</td>" in box  # and its error against the served sampled
    assert ("<td>sampled</td><td>9.0% (pilot)</td><td>8.0%</td><td>+1.0 pts</td><td>20.0% (greedy)</td>"
            "<td>17.0%</td><td>+3.0 pts</td>") in box
    assert 'id="f-decoding">greedy<' in box
    # without evidence there is no forecast box at all
    assert 'class="forecast' not in text(sample_app(web_samples.lab_status()).test_client().get("/"))


def test_the_acceptance_curve_leads_the_train_page():
    from status_web import model as web_model

    names = ["train/loss", "acceptance/mean_length", "train/full_acc_0", "acceptance/rate", "lr"]
    assert sorted(names, key=web_model.metric_rank)[:2] == ["acceptance/rate", "acceptance/mean_length"]
