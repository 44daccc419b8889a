"""A plan that does not fit is refused before launch (issue 28, item 2): `lab plan --offline` says so,
`lab preflight STAGE` fails it, `lab pipeline` starts nothing. Real `lab` processes on a copy of conf/
(the kimi-k2.5 profile, whose host does not exist here: nothing may need it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "bin" / "lab"


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    c = tmp_path / "conf"
    shutil.copytree(REPO / "conf", c)
    lab = (c / "lab.yaml").read_text()
    (c / "lab.yaml").write_text(lab.replace("logs_dir: logs", f"logs_dir: {tmp_path / 'logs'}")
                                if "logs_dir:" in lab else f"logs_dir: {tmp_path / 'logs'}\n" + lab)
    return c


@pytest.fixture
def conf(shipped: Path) -> Path:
    """The kimi-k2.5 profile as it was before the pilot's own window: the pilot after synth, beside
    serve_extract on GPU 0, where it does not fit (what the plan must refuse)."""
    prof = shipped / "profiles" / "kimi-k2.5.yaml"
    text = prof.read_text()
    assert "pilot_window: own" in text and "pilot: {host: gpu8, needs: [serve_extract]," in text
    prof.write_text(text.replace("pilot_window: own", "pilot_window: beside").replace(
        "pilot: {host: gpu8, needs: [serve_extract],",
        "pilot: {host: gpu8, needs: [serve_extract], during: null, depends_on: [synth, eval_baseline],"))
    return shipped


def test_the_shipped_kimi_plan_fits_with_the_first_forecast_in_its_first_hours(shipped):
    p = lab(shipped, "plan", "--offline")
    assert p.returncode == 0 and "DOES NOT FIT" not in p.stdout, p.stdout + p.stderr
    j = json.loads(lab(shipped, "plan", "--offline", "--json").stdout)["plan"]
    assert j["fits"] is True and j["first_forecast"]["stage"] == "pilot"
    assert j["first_forecast"]["at_s"] < 2 * 3600 < 6 * 3600 < j["total_s"] < 24 * 3600
    p = lab(shipped, "preflight", "pilot", "--json")
    fits = [c for c in json.loads(p.stdout)["checks"] if c["name"] == "fit"]
    assert fits and all(c["verdict"] != "FAIL" for c in fits), fits


def lab(conf: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EAGLELAB_CONF": str(conf)}
    env.pop("EAGLELAB_PROFILE", None)
    env.pop("EAGLELAB_NO_FIT", None)
    return subprocess.run([str(LAB), "--profile", "kimi-k2.5", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_plan_offline_names_the_pilot_beside_serve_extract(conf):
    p = lab(conf, "plan", "--offline")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "DOES NOT FIT (1):" in p.stdout  # the eval sweeps fit the day since eval_rounds (test_sizing)
    assert ("pilot: gpu 51.5 GiB > 14.3 GiB: pilot needs 51.5 GiB (peak allocated 42.6 GiB) on GPU 0, beside "
            "serve_extract (holding 81.3 GiB of it) (95.6 GiB a GPU)") in p.stdout
    assert "fix: no gpu_memory_utilization of serve_extract leaves room" in p.stdout
    j = json.loads(lab(conf, "plan", "--offline", "--json").stdout)
    assert j["plan"]["fits"] is False and [m["stage"] for m in j["plan"]["misfits"]] == ["pilot"]
    assert "pipeline: time" not in p.stdout


def test_preflight_fails_the_stage_that_does_not_fit_and_warns_the_others(conf):
    p = lab(conf, "preflight", "pilot", "--json")
    assert p.returncode == 1
    fits = [c for c in json.loads(p.stdout)["checks"] if c["name"] == "fit"]
    assert [c["verdict"] for c in fits] == ["FAIL"] and "serve_extract" in fits[0]["detail"]
    p = lab(conf, "preflight", "vocab", "--json")
    fits = [c for c in json.loads(p.stdout)["checks"] if c["name"] == "fit"]
    assert [c["verdict"] for c in fits] == ["WARN"] and fits[0]["detail"].startswith("later in the plan: pilot")
    # (the budget failing every stage's preflight: test_disk_and_budget_refused_by_plan_preflight_and_pipeline)


def test_disk_and_budget_refused_by_plan_preflight_and_pipeline(conf):
    facts = conf / "facts" / "kimi-k2.5.yaml"
    facts.write_text(facts.read_text().replace("disk_bytes: 1.5e12", "disk_bytes: 5.0e11"))
    prof = conf / "profiles" / "kimi-k2.5.yaml"
    prof.write_text(prof.read_text().replace('plan_budget_h: "24"', 'plan_budget_h: "10"'))
    j = json.loads(lab(conf, "plan", "--offline", "--json").stdout)
    mis = {m["what"]: m for m in j["plan"]["misfits"]}
    assert mis["disk"]["stage"] == "extract" and mis["disk"]["capacity"] == 500.0
    assert mis["disk"]["estimate"] > 500 and "free disk on the host" in mis["disk"]["fix"]
    assert mis["time"]["stage"] == "pipeline" and mis["time"]["capacity"] == 10.0 and mis["time"]["estimate"] > 10
    assert "plan_budget_h" in mis["time"]["fix"]
    p = lab(conf, "preflight", "extract", "--json")
    fails = {c["detail"].split(":")[0] for c in json.loads(p.stdout)["checks"] if c["name"] == "fit" and not c["ok"]
             and c["ok"] is not None}
    assert fails == {"extract", "pipeline"}
    p = lab(conf, "pipeline", "--no-notify", "-q")
    assert p.returncode != 0
    assert "the plan does not fit" in p.stderr and "extract: disk" in p.stderr and "pipeline: time" in p.stderr
    assert "pilot: gpu" in p.stderr and "EAGLELAB_NO_FIT=1" in p.stderr
    st = json.loads(lab(conf, "status", "--json", "--no-refresh").stdout)
    assert st["runs"] == []                                   # nothing launched


def test_no_fit_turns_the_check_into_a_warning(conf):
    env = {**os.environ, "EAGLELAB_CONF": str(conf), "EAGLELAB_NO_FIT": "1"}
    p = subprocess.run([str(LAB), "--profile", "kimi-k2.5", "preflight", "pilot", "--json"], capture_output=True,
                       text=True, env=env, timeout=120)
    fits = [c for c in json.loads(p.stdout)["checks"] if c["name"] == "fit"]
    assert [c["verdict"] for c in fits] == ["WARN"] and "EAGLELAB_NO_FIT=1" in fits[0]["detail"]


HOST_PIPELINE = """\
vars: {model: MODEL}
stages:
  serve:
    kind: service
    host: local
    command: ["${python}", "-m", "eaglelab.stages.serve", "--model", "${model}", "--device", "cuda",
              "--tensor-parallel", "1", "--gpu-memory-utilization", "0.9", "--max-model-len", "8192"]
    inputs: ["${model}"]
    ready: {log_regex: "ready", timeout_s: 60}
  job:
    host: local
    command: ["true"]
    needs: [serve]
"""


def test_preflight_plans_with_the_models_own_config_json_as_the_host_reads_it(tmplab):
    """${model} is relative to the host's repo_dir: there the host holds a 70B-like model (its config.json,
    140 GB of safetensors as a sparse file), while this checkout has no such directory and the facts file
    says a tiny model. `lab plan --offline` (no host) plans the facts file's; preflight's fit check reads the
    host's answer and refuses the server on a 24 GiB GPU."""
    host_repo = tmplab.root / "hostrepo"
    model = host_repo / "models" / "big"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256}))
    with open(model / "model.safetensors", "wb") as f:
        f.truncate(140 * 10**9)  # sparse: its size is what the host reports, no disk is used
    lab_yaml = tmplab.conf / "lab.yaml"
    lab_yaml.write_text(lab_yaml.read_text().replace(f"repo_dir: {REPO}", f"repo_dir: {host_repo}"))
    tmplab.write_pipeline(HOST_PIPELINE.replace("MODEL", "models/big"))
    (tmplab.conf / "facts").mkdir()
    (tmplab.conf / "facts" / "test.yaml").write_text(
        "model: {name: tiny, layers: 4, hidden_size: 128, vocab_size: 4096, heads: 4, kv_heads: 2,\n"
        "        intermediate_size: 256, weight_bytes: 3300000}\nhosts:\n  local: {gpu_memory_gib: 24}\n")
    offline = json.loads(tmplab.lab("plan", "--offline", "--json").stdout)["plan"]
    assert offline["fits"] is True and offline["facts"].endswith("facts/test.yaml")
    p = tmplab.lab("preflight", "serve", "--json", check=False)
    fits = [c for c in json.loads(p.stdout)["checks"] if c["name"] == "fit"]
    assert [c["verdict"] for c in fits] == ["FAIL"], fits
    assert fits[0]["detail"].startswith("serve: gpu") and "no KV cache" in fits[0]["detail"]
