"""The engine check (docs/foresight.md, "The engine check"): synth's server is the target WITH a known drafter,
and beside synth vLLM's own acceptance counters are held against the same drafter's offline acceptance on the
same rows; a served figure far below the offline one is an engine-path alarm in `lab status`, the page and a
webhook.

The fault replay, real parts: the tiny target and a drafter the train stage trained on the target's own greedy
answers (8 epochs), served by real vLLM on CPU through the real `bin/lab pipeline` (serve_synth, synth,
engine_check beside it) of a lab whose pipeline is conf/pipeline.yaml's serve_target and synth. Twice, one
vLLM start each: the healthy drafter (no alarm), and the same drafter whose served copy has its d2t mapping
zeroed (the offline estimate still reads the original): the alarm, naming both figures. Greedy synth rows
are the same token for token under both (48 rows): speculative decoding does not change what the target says (the
faulty copy's drafts are all rejected, so its rows are the target's alone)."""

from __future__ import annotations

import json
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

import foresight_data
from conftest import TmpLab, kill_unfinished
from eaglelab import config
from eaglelab.engine_check_stages import without
from eaglelab.errors import ConfigError
from eaglelab.figures import engine_words
from eaglelab.stages import engine_check

REPO = Path(__file__).resolve().parents[1]
PORT = 8654  # serve_synth's in the config tests (the replay below takes free ports)
SLOW = pytest.mark.timeout(2400)  # a drafter (8 epochs), then two labs of one vLLM start each: ~6 min idle


# ---- the pieces, no vLLM ---------------------------------------------------------------------------

def test_the_judgement():
    j = engine_check.judge(0.004, 0.164, 612, 0.6, 20)
    assert j["alarm"] and j["ratio"] == pytest.approx(0.004 / 0.164) and j["no_judgement"] is None
    assert not engine_check.judge(0.15, 0.164, 612, 0.6, 20)["alarm"]
    few = engine_check.judge(0.0, 0.164, 5, 0.6, 20)
    assert not few["alarm"] and "fewer than --min-drafts 20" in few["no_judgement"]
    assert not engine_check.judge(0.0, 0.0, 500, 0.6, 20)["alarm"]
    line = engine_check.metric_line(j, 16)
    assert "engine/served_rate=0.0040" in line and "engine/offline_rate=0.1640" in line and line.endswith("engine/alarm=1")


def test_without_drops_an_option_and_its_value():
    assert without(["a", "--port", "8100", "--mode=plain", "--model", "m"], ("--port", "--mode")) == ["a", "--model", "m"]


def _write_conf(lab: TmpLab, engine: dict | None, vars_: dict, extra_env: dict | None = None) -> None:
    """conf/pipeline.yaml's vars, serve_target and synth (their real commands), this test's vars on top."""
    real = yaml.safe_load((REPO / "conf" / "pipeline.yaml").read_text())
    doc = {"vars": {**real["vars"], **vars_},
           "env": {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", **(extra_env or {})},
           "stages": {k: real["stages"][k] for k in ("serve_target", "synth")}}
    if engine is not None:
        doc["engine_check"] = engine
    lab.write_pipeline(yaml.safe_dump(doc, sort_keys=False))


def test_the_key_serves_synth_with_the_drafter_and_adds_the_check(tmp_path):
    lab = TmpLab(tmp_path)
    _write_conf(lab, {"drafter": "ck/7", "min_ratio": 0.5, "rows": 8, "port": PORT}, {})
    cfg = config.load(lab.conf)
    svc, synth, job = cfg.stage("serve_synth"), cfg.stage("synth"), cfg.stage("engine_check")
    argv = [cfg.render(svc, a, cfg.vars_for(svc)) for a in svc.command]
    assert argv.count("--port") == 1 and argv[argv.index("--port") + 1] == str(PORT)
    assert argv[argv.index("--mode") + 1] == "eval" and argv[argv.index("--drafter") + 1] == "ck/7"
    assert svc.kind == "service" and svc.keep_alive_s == 0 and svc.ready.url.endswith(f":{PORT}/health")
    assert synth.needs == ["serve_synth"] and synth.command[-2:] == ["--endpoint", f"http://${{host_addr}}:{PORT}"]
    assert job.during.stage == "synth" and job.during.after == 8 and "--min-ratio" in job.command
    assert cfg.stage("serve_target").command == yaml.safe_load(
        (REPO / "conf" / "pipeline.yaml").read_text())["stages"]["serve_target"]["command"]  # untouched: the baseline's
    _write_conf(lab, None, {})
    assert "engine_check" not in config.load(lab.conf).stages  # off unless asked for
    lab.write_pipeline("stages:\n  a: {host: local, command: [\"true\"]}\nengine_check: {drafter: x}\n")
    with pytest.raises(ConfigError, match=r"pipeline.yaml: engine_check: .*no 'serve_target'"):
        config.load(lab.conf)
    lab.write_pipeline("stages:\n  a: {host: local, command: [\"true\"]}\nengine_check: {drafter: x, min_ratio: 2}\n")
    with pytest.raises(ConfigError, match="min_ratio"):
        config.load(lab.conf)


def test_the_words_name_both_figures():
    eng = {"served_rate": 0.004, "offline_rate": 0.164, "ratio": 0.0244, "min_ratio": 0.6, "drafts": 612, "alarm": True}
    assert engine_words(eng) == ("vLLM served the drafter at 0.4% acceptance (612 drafts), offline 16.4% on the same "
                                 "synth rows: 0.02x, below min_ratio 0.6")


# ---- the fault replay: real vLLM, the real pipeline ------------------------------------------------

class Hook:
    """A webhook receiver on a port of ours; the JSON bodies it was posted."""

    def __init__(self, port: int):
        self.bodies: list[dict] = []
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                me.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{port}/hook"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    """A port nobody listens on now (a fixed one may be taken by another run of the suite: no skip)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _zero_d2t(src: Path, dst: Path) -> None:
    """A served copy whose draft-to-target mapping is wrong (all offsets 0): only vLLM reads it."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    assert "d2t" in weights and weights["d2t"].abs().sum() > 0
    weights["d2t"] = weights["d2t"] * 0
    save_file(weights, str(dst / "model.safetensors"))


@pytest.fixture(scope="module")
def replay(tiny_data, tmp_path_factory):
    """The drafter, then the healthy and the faulty lab, each through `lab pipeline` once."""
    port, hook_port = _free_port(), _free_port()
    root = tmp_path_factory.mktemp("engine_check")
    ck = root / "ck"
    foresight_data.run_stage(
        "train", "--model", str(tiny_data["model"]), "--data", str(tiny_data["prepared"]),
        "--hidden-states", str(tiny_data["hidden_states"]), "--vocab", str(tiny_data["vocab"]), "--out", str(ck),
        "--aux-layers", foresight_data.AUX, "--draft-vocab-size", foresight_data.DRAFT_VOCAB, "--epochs", "8",
        "--lr", "3e-3", "--loss-fn", "ce", "--total-seq-len", "1024", "--device", "cpu", "--acceptance-k", "0")
    drafter = ck / "7"
    _zero_d2t(drafter, root / "served_faulty")
    # the drafter's 16 prompts three times over (new ids), one at a time: synth lasts long enough (~20 s idle) for
    # the check to start while it runs and read vLLM's counters live
    prompts = [json.loads(x) for x in (tiny_data["root"] / "prompts.jsonl").read_text().splitlines() if x.strip()]
    (root / "prompts.jsonl").write_text("".join(json.dumps({**p, "id": f"{p['id']}-{i}"}) + "\n"
                                                for i in range(3) for p in prompts))
    vars_ = {"model": str(tiny_data["model"]), "prompts": str(root / "prompts.jsonl"), "device": "cpu",
             "max_model_len": "1280", "seq_length": "1024", "prompt_max_tokens": "128", "synth_max_tokens": "64",
             "synth_limit": "48", "synth_concurrency": "1", "kv_cache_gib": "1"}
    hook = Hook(hook_port)
    out = {"hook": hook}
    try:
        for name, served in (("healthy", drafter), ("faulty", root / "served_faulty")):
            lab = TmpLab(root / name)
            if name == "faulty":
                lab.write_lab(f"notify:\n  webhooks:\n    - {{url: '{hook.url}'}}\n")
            _write_conf(lab, {"drafter": str(drafter), "served_drafter": str(served), "min_ratio": 0.6, "rows": 8,
                              "port": port}, {**vars_, "data": str(root / name / "data")})
            try:
                p = lab.lab("pipeline", "--no-notify", check=False, timeout=1800)
                status = lab.status()
                text = lab.lab("status").stdout
            finally:
                kill_unfinished(lab.run_dirs())
            out[name] = {"lab": lab, "p": p, "status": status, "text": text, "data": root / name / "data"}
        yield out
    finally:
        hook.close()


def _engine(status: dict) -> dict:
    sj = next(s for s in status["pipeline"]["side_jobs"] if s["stage"] == "engine_check")
    return {**sj, **(sj.get("engine") or {})}


def _rows(data: Path) -> dict:
    rows = [json.loads(x) for x in (data / "synth" / "responses.jsonl").read_text().splitlines() if x.strip()]
    return {r["id"]: r["input_ids"] for r in rows}


@SLOW
def test_the_healthy_drafter_raises_no_alarm(replay):
    got = replay["healthy"]
    eng = _engine(got["status"])
    assert eng["state"] == "completed", got["p"].stdout[-3000:] + got["p"].stderr[-3000:]
    assert eng["alarm"] is False and eng["drafts"] >= 20
    assert eng["served_rate"] >= 0.6 * eng["offline_rate"] > 0, eng
    assert "ENGINE-PATH ALARM" not in got["text"] and "engine check: vLLM served the drafter at" in got["text"]
    check = json.loads((got["data"] / "engine_check" / "check.json").read_text())
    # synth is greedy here: no sampled probe beside it (it spoiled a greedy row on this engine: probe_skipped)
    assert check["output_probe"] is None and check["output_probe_skipped"].startswith("synth is greedy")
    print(f"healthy: served {check['served_rate']:.4f} ({check['drafts']} drafts) offline {check['offline_rate']:.4f} "
          f"ratio {check['ratio']:.3f}; {check['seconds']} s")


@SLOW
def test_the_drafter_served_wrong_is_caught_during_synth(replay):
    got = replay["faulty"]
    eng = _engine(got["status"])
    assert eng["state"] == "failed" and eng["alarm"] is True, got["p"].stdout[-3000:]
    assert eng["served_rate"] < 0.6 * eng["offline_rate"]
    words = engine_words(eng)
    assert f"ENGINE-PATH ALARM: {words}" in " ".join(got["text"].split())  # lab status, both figures
    assert "engine-path alarm: vLLM served the drafter" in eng["reason"]
    from status_web.app import create_app  # the page's banner, on the lab's own status
    app = create_app(source=lambda: got["status"], start=False)
    app.extensions["eaglelab"].snapshot.refresh_now()
    page = app.test_client().get("/").get_data(as_text=True)
    banner = page[page.index('id="engine-alarm"'):]
    assert f'<span class="mono">{words}</span>' in banner[:banner.index("</div>")]
    from conftest import wait_for
    wait_for(lambda: any(b.get("alarm") == "engine_path" for b in replay["hook"].bodies), timeout=120)
    body = next(b for b in replay["hook"].bodies if b.get("alarm") == "engine_path")
    assert body["stage"] == "engine_check" and body["text"].startswith("ENGINE-PATH ALARM on ")
    assert f"{eng['served_rate']:.1%} acceptance" in body["text"] and f"is {eng['offline_rate']:.1%}" in body["text"]
    check = json.loads((got["data"] / "engine_check" / "check.json").read_text())
    runs = {r["stage"]: r for r in got["status"]["runs"]}
    assert runs["engine_check"]["started_at"] < runs["synth"]["ended_at"]  # during synth: vLLM's counters, live
    assert check["served_source"].endswith("/metrics")
    print(f"faulty: served {check['served_rate']:.4f} ({check['drafts']} drafts) offline {check['offline_rate']:.4f} "
          f"ratio {check['ratio']:.3f}; {check['seconds']} s")


@SLOW
def test_greedy_synth_rows_are_the_same_with_either_drafter(replay):
    healthy, faulty = _rows(replay["healthy"]["data"]), _rows(replay["faulty"]["data"])
    assert len(healthy) == 48 and healthy == faulty


def test_the_output_alarm_puts_its_figures_first_and_says_what_synth_keeps():
    probe = {"settings": [{"name": "near_greedy", "temperature": 0.01, "top_p": 1.0, "tokens": 128, "impossible": 92,
                           "share": 92 / 128}], "verdict": {"fault": True}}
    j = engine_check.judge(0.042, 0.224, 2560, 0.6, 20)
    text = engine_check.output_alarm_text(probe, "ck/7", False, j, 8)
    assert text.startswith("engine-path alarm: with the drafter ck/7, vLLM emits tokens its own target ranks impossible "
                           "(92/128 (72%) at T=0.01; a correct engine: ~0); and it served it at 4.2% acceptance "
                           "(2560 drafts) where its offline acceptance on the same 8 synth rows is 22.4% (0.19x")
    assert "synth's greedy rows are unaffected" in text
    assert engine_check.probe_skipped(4, 0.0, "http://x/metrics").startswith("synth is greedy")
    assert engine_check.probe_skipped(4, 1.0, "synth/manifest.json extra.served_spec").startswith("synth has finished")
    assert engine_check.probe_skipped(0, 1.0, "http://x/metrics") == "engine_check output_probe is 0"
    assert engine_check.probe_skipped(4, 1.0, "http://x/metrics") is None  # beside a sampled synth: it runs
    sampled = engine_check.output_alarm_text(probe, "ck/7", True)
    assert "acceptance (" not in sampled and "synth's sampled rows through it are not the target's" in sampled
    line = engine_check.metric_line(j, 8, {**probe, "verdict": {"fault": True, "worst": {"share": 0.71875}}})
    assert "engine/outputs_impossible=0.7188, engine/outputs_fault=1, engine/alarm=1" in line
    words = engine_words({"served_rate": 0.18, "offline_rate": 0.2, "ratio": 0.9, "min_ratio": 0.6, "drafts": 600,
                          "outputs_impossible": 0.72, "outputs_fault": True})
    assert words.endswith("0.90x, at or above min_ratio 0.6; its outputs: 72% of the probed tokens impossible by the "
                          "logprobs of its own target (NOT the target distribution; a correct engine: ~0)")


def test_the_probes_figures_reach_lab_status_from_the_metric_line():
    from eaglelab.control.status import engine_figures
    from eaglelab.host.parse.state import LogState

    j = engine_check.judge(0.18, 0.2, 600, 0.6, 20)
    probe = {"verdict": {"fault": True, "worst": {"share": 0.72}}}
    st = LogState()
    st.feed_line(engine_check.metric_line({**j, "alarm": True}, 8, probe), 1)
    run = {"id": "engine_check-1", "state": "failed", "log_state": {"metrics": st.snapshot()["metrics"]}}
    eng = engine_figures(run)
    assert eng["alarm"] is True and eng["outputs_fault"] is True and eng["outputs_impossible"] == pytest.approx(0.72)
    assert "its outputs: 72% of the probed tokens impossible" in engine_words(eng)
    st = LogState()
    st.feed_line(engine_check.metric_line(j, 8), 1)  # no probe (greedy synth): no such words
    eng = engine_figures({**run, "state": "completed", "log_state": {"metrics": st.snapshot()["metrics"]}})
    assert "outputs_fault" not in eng and "its outputs" not in engine_words(eng) and eng["alarm"] is False
