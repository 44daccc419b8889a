"""The serving smoke (docs/foresight.md, "The serving smoke"): `serve --mode eval --smoke-checkpoints DIR`, the job
smoke-serve_eval beside train.

Real vLLM (CPU) on the tiny target and a drafter the train stage trained for 2 epochs: the smoke serves
the latest whole checkpoint with the eval's own argv, prints the served metric line the log parser
reads, stops vLLM (its process group gone, its port free) and exits 0; a vLLM flag vLLM rejects fails
fast with vLLM's own words and the checkpoint named; a damaged checkpoint and no checkpoint at all fail
before vLLM starts. Through the real `bin/lab pipeline` and jobwrap (a stand-in service script): a
service's smoke runs beside train, its figure reaches pipeline.forecast.served_checkpoint, and when
it fails the job that needs the service is not started."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import foresight_data
from eaglelab import config, side_jobs
from eaglelab.host.parse.state import LogState
from eaglelab.stages import serve, serve_smoke

REPO = Path(__file__).resolve().parents[1]
PORT, BAD_PORT = 8640, 8641
SLOW = pytest.mark.timeout(1800)  # data + 2 epochs + one vLLM start: ~5 min idle on 2 cores, more when loaded


# ---- the pieces, no vLLM ---------------------------------------------------------------------------

def _checkpoint(d: Path, nbytes_cut: int = 0) -> None:
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    save_file({"w": torch.zeros(64)}, str(d / "model.safetensors"))
    if nbytes_cut:
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[:-nbytes_cut])


def test_the_latest_whole_checkpoint_is_served_and_one_being_written_is_not(tmp_path):
    assert serve_smoke.latest_checkpoint(tmp_path / "none") is None
    _checkpoint(tmp_path / "0")
    _checkpoint(tmp_path / "1")
    _checkpoint(tmp_path / "2", nbytes_cut=16)  # safetensors still writing its data
    (tmp_path / "3").mkdir()                    # config.json not there yet
    (tmp_path / "drafter").symlink_to(tmp_path / "1")
    assert serve_smoke.latest_checkpoint(tmp_path) == tmp_path / "1"


def test_the_metric_line_is_read_by_the_log_parser():
    stats = {"acceptance_rate": 0.183, "mean_acceptance_length": 1.549, "drafts": 48,
             "per_position_acceptance": [0.3, 0.2, 0.049]}
    line = serve_smoke.metric_line(stats, 2)
    assert line.startswith("served/acceptance_rate=0.1830, served/mean_acceptance_length=1.5490, served/drafts=48")
    st = LogState()
    st.feed_line(line, 1)
    m = st.snapshot()["metrics"]
    assert m["served/acceptance_rate"][-1][1] == 0.183 and m["served/mean_acceptance_length"][-1][1] == 1.549
    assert m["served/epoch"][-1][1] == 2 and m["served/pos_2"][-1][1] == 0.049


def test_a_stop_of_the_smoke_stops_its_server_group_first(tmp_path):
    """`lab stop` TERMs the smoke: it stops the server's whole group (a child of it too) before it exits."""
    server = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
              " print('listening', flush=True); time.sleep(300)")
    code = ("import sys; from pathlib import Path; from eaglelab.stages import serve_smoke\n"
            f"serve_smoke.run([sys.executable, '-c', {server!r}], {{}}, Path('ck/3'), '127.0.0.1', 8642, 'm', None,"
            " 1, 4, 600, lambda s: print(s, flush=True))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO / "py")))
    pid = vllm_pid(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "listening"  # its output goes on to the smoke's
    proc.terminate()
    assert proc.wait(60) == 128 + 15
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_the_pipeline_has_the_serving_smoke_beside_train_on_a_port_of_its_own():
    cfg = config.load(REPO / "conf", "demo")
    s = cfg.stage("smoke-serve_eval")
    assert s.kind == "job" and s.smoke_of == "serve_eval" and s.during.stage == "train" and s.gpus == 0
    assert side_jobs.describe(cfg, "smoke-serve_eval").startswith("beside train, once it has made 1 unit(s)")
    argv = [cfg.render(s, a, cfg.vars_for(s)) for a in s.command]
    assert argv[argv.index("--smoke-checkpoints") + 1] == "data/demo/checkpoints"
    assert argv[argv.index("--smoke-prompts") + 1] == "data/demo/eval_prompts.jsonl"
    # the service's own port first, the smoke's after it: click takes the last one
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--port"] == ["8102", "8103"]
    ctx = serve.main.make_context("serve", argv[argv.index("eaglelab.stages.serve") + 1:])
    assert ctx.params["port"] == 8103 and ctx.params["smoke_checkpoints"] == Path("data/demo/checkpoints")
    assert "smoke-serve_eval" not in config.load(REPO / "conf", "kimi-k2.5").stages  # 8 GPUs for the 1T target


def test_a_service_may_have_a_smoke_but_not_run_beside(tmplab):
    tmplab.write_lab("")
    tmplab.write_profile("test", "vars: {}\n")
    tmplab.write_pipeline(PIPELINE.replace("    smoke: {during: train", "    during: {stage: train}\n    smoke: {during: train"))
    p = tmplab.lab("status", check=False)
    assert p.returncode != 0 and "stages.serve_eval.during: stages.serve_eval is a service" in p.stderr, p.stderr


# ---- through bin/lab pipeline: a stand-in service whose smoke prints what serve_smoke prints --------

TRAIN = ("import os, sys, time\n"
         "print('acceptance/rate=0.2500, acceptance/mean_length=1.7500, epoch=0, global_step=10', flush=True)\n"
         "for i in range(13):\n"
         "    print(f'Training: {100 * i // 12}%|##| {i}/12 [00:01<00:01,  4.00it/s]', flush=True)\n"
         "    time.sleep(0.5)\n"
         "os.makedirs(sys.argv[1], exist_ok=True); open(sys.argv[1] + '/done', 'w').write('1')\n")
SERVICE = ("import sys, time\n"
           "args = sys.argv[1:]\n"
           "if '--smoke-checkpoints' in args:\n"
           "    flag = args[args.index('--flag') + 1]\n"
           "    if flag != 'ok':\n"
           "        sys.exit(f'Error: serve smoke of checkpoint ck/0: vLLM exited with code 2 before '\n"
           "                 f'http://127.0.0.1:1/health answered: api_server.py: error: unrecognized arguments: {flag}')\n"
           "    print('served/acceptance_rate=0.1830, served/mean_acceptance_length=1.5490, served/drafts=48, '\n"
           "          'served/epoch=0, epoch=0', flush=True)\n"
           "    sys.exit(0)\n"
           "print('up', flush=True)\n"
           "time.sleep(600)\n")
PIPELINE = """\
vars:
  flag: ok
stages:
  train:
    host: local
    command: ["${python}", "-c", %s, "${work_dir}/ck"]
    outputs: ["${work_dir}/ck"]
    stop_grace_s: 2
  serve_eval:
    kind: service
    host: local
    command: ["${python}", "-c", %s, "--flag", "${flag}"]
    ready: {log_regex: "^up"}
    stop_grace_s: 2
    smoke: {during: train, after: "2", args: ["--smoke-checkpoints", "${work_dir}/ck"]}
  eval:
    host: local
    command: ["${python}", "-c", "import os, sys; os.makedirs(sys.argv[1], exist_ok=True)", "${work_dir}/eval"]
    outputs: ["${work_dir}/eval"]
    depends_on: [train]
    needs: [serve_eval]
""" % (json.dumps(TRAIN), json.dumps(SERVICE))


def _setup(tmplab, flag: str) -> None:
    tmplab.write_lab("")
    tmplab.write_pipeline(PIPELINE)
    tmplab.write_profile("test", f"vars: {{flag: {flag!r}}}\n")


def test_a_services_smoke_runs_beside_train_and_its_figure_joins_the_forecast(tmplab):
    _setup(tmplab, "ok")
    plan = [ln.split()[0] for ln in tmplab.lab("plan").stdout.splitlines() if ln and not ln.startswith((" ", "-"))]
    assert plan == ["train", "smoke-serve_eval", "eval"], plan
    p = tmplab.lab("pipeline", check=False, timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    [train], [smoke], [ev] = (tmplab.runs(s) for s in ("train", "smoke-serve_eval", "eval"))
    assert smoke["state"] == ev["state"] == "completed" and smoke["started_at"] < train["ended_at"]
    fc = tmplab.status()["pipeline"]["forecast"]
    assert fc["source"] == "checkpoint" and fc["acceptance_rate"] == 0.25  # the ranking is unchanged
    assert fc["served_checkpoint"] == {"acceptance_rate": 0.183, "mean_acceptance_length": 1.549,
                                       "run": smoke["id"], "epoch": 0}
    assert "served checkpoint 0: acceptance 18.3%, mean length 1.55" in tmplab.lab("status").stdout


def test_a_failed_smoke_of_a_service_keeps_the_job_that_needs_it_from_starting(tmplab):
    _setup(tmplab, "--bogus")
    p = tmplab.lab("pipeline", check=False, timeout=200)
    assert p.returncode != 0
    assert "serve_eval WILL FAIL: its smoke test" in p.stdout, p.stdout
    assert re.search(r"not starting eval: the smoke test of serve_eval, which it needs, smoke-serve_eval-\S+ "
                     r"failed with this config: .*unrecognized arguments: --bogus", p.stdout), p.stdout
    assert [r["state"] for r in tmplab.runs("train")] == ["completed"]
    assert tmplab.runs("eval") == [] and tmplab.runs("serve_eval") == []  # the server was not even started


# ---- real vLLM ---------------------------------------------------------------------------------------

@pytest.fixture
def trained(tiny_drafter):
    """The tiny target and a drafter the train stage trained for 2 epochs (checkpoints 0 and 1): the
    session's (tests/conftest.py), the one test_acceptance estimates."""
    return tiny_drafter


def smoke(trained, ckpts: Path, port: int, *more: str) -> subprocess.CompletedProcess:
    """The smoke-serve_eval command the pipeline runs: the serve_eval command, then the smoke's args."""
    argv = [sys.executable, "-m", "eaglelab.stages.serve", "--mode", "eval", "--model", str(trained["model"]),
            "--host", "127.0.0.1", "--port", "8102", "--device", "cpu", "--max-model-len", "1280",
            "--kv-cache-gib", "1", "--aux-layers", foresight_data.AUX,
            "--drafter", str(trained["ck"] / "drafter-not-yet"), "--num-speculative-tokens", "3", *more,
            "--port", str(port), "--smoke-checkpoints", str(ckpts), "--smoke-prompts", str(trained["prompts"]),
            "--smoke-wait-s", "5"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"))
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1500)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def vllm_pid(out: str) -> int:
    return int(re.search(r"serve smoke: vLLM pid (\d+)", out).group(1))


def assert_gone(pid: int, port: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # no process of vLLM's group is left (EngineCore included)
    assert port_free(port)


@SLOW
def test_the_smoke_serves_the_latest_checkpoint_measures_and_stops_vllm(trained):
    p = smoke(trained, trained["ck"], PORT)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert f'"model": "{trained["ck"] / "1"}"' in out  # the latest epoch, in the eval's own --speculative-config
    [line] = [ln for ln in p.stdout.splitlines() if ln.startswith("served/acceptance_rate=")]
    m = re.fullmatch(r"served/acceptance_rate=([\d.]+), served/mean_acceptance_length=([\d.]+), served/drafts=(\d+)"
                     r"(, served/pos_\d=[\d.]+){3}, served/epoch=1, epoch=1", line)
    assert m and int(m.group(3)) > 0, line
    rate, length = float(m.group(1)), float(m.group(2))
    assert 0.0 <= rate <= 1.0 and 1.0 <= length <= 4.0  # k = 3 draft tokens
    st = LogState()
    for i, ln in enumerate(p.stdout.splitlines()):
        st.feed_line(ln, i + 1)
    assert st.snapshot()["metrics"]["served/acceptance_rate"][-1][1] == rate
    assert_gone(vllm_pid(out), PORT)


@SLOW
def test_a_flag_vllm_rejects_fails_fast_naming_the_checkpoint(trained):
    p = smoke(trained, trained["ck"], BAD_PORT, "--vllm-args", "--no-such-vllm-flag 1")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    first = [ln for ln in p.stderr.splitlines() if ln.startswith("Error: ")][-1]
    assert first.startswith(f"Error: serve smoke of checkpoint {trained['ck'] / '1'}: vLLM exited with code"), first
    assert "--no-such-vllm-flag" in first  # vLLM's own last line, on the line the log parser reports
    assert "served/acceptance_rate" not in out
    assert_gone(vllm_pid(out), BAD_PORT)


@SLOW
def test_a_damaged_checkpoint_or_none_fails_before_vllm_starts(trained, tmp_path):
    shutil.copytree(trained["ck"] / "1", tmp_path / "ck" / "4")
    (tmp_path / "ck" / "4" / "config.json").write_text('{"architectures": ["Eagle3Speculator"], ')
    p = smoke(trained, tmp_path / "ck", BAD_PORT)
    assert p.returncode == 1
    assert f"Error: serve smoke of checkpoint {tmp_path / 'ck' / '4'}: {tmp_path / 'ck' / '4' / 'config.json'}: " \
           "not valid JSON" in p.stderr, p.stderr[-2000:]
    assert "vLLM pid" not in p.stdout + p.stderr
    p = smoke(trained, tmp_path / "empty", BAD_PORT)
    assert p.returncode == 1 and "no whole epoch checkpoint" in p.stderr and "after 5 s" in p.stderr, p.stderr
