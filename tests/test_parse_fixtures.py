"""`lab parse` on every real log collected (tests/fixtures/logs/SOURCES.md says where each is from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglelab.control.commands.parse import parse_cmd
from eaglelab.host.tail.whole import parse_file

LOGS = Path(__file__).parent / "fixtures" / "logs"
PUBLIC = LOGS / "public"

# file -> (state, failure reason or None, (bar label, n, total) or None, phase or None)
EXPECTED = {
    "vllm_tp_slow_shards.log": ("running", None, ("Loading safetensors checkpoint shards", 33, 85), "weights_loading"),
    "sglang_dsv3_shards.log": ("running", None, ("Loading safetensors checkpoint shards", 133, 163), "weights_loading"),
    "vllm_engine_core_startup.log": ("running", None, ("Loading safetensors checkpoint shards", 3, 3), "engine_init"),
    "vllm_worker_tp0_load.log": ("running", None, ("Loading safetensors checkpoint shards", 9, 9), "compiling"),
    "vllm_v0_cuda_graphs.log": ("running", None, ("Capturing CUDA graph shapes", 35, 35), None),
    "vllm_multiproc_oom.log": ("failed", "cuda_oom", None, None),
    "vllm_ray_oom_traceback.log": ("failed", "cuda_oom", None, None),
    "dots_ocr_oom_then_warning.log": ("failed", "cuda_oom", None, None),
    "llamafactory_nccl_watchdog.log": ("failed", "nccl_error", None, None),
    "vlmr1_nccl_watchdog_stuck.log": ("failed", "nccl_error", None, None),
    "torchrun_childfailed_sigkill.log": ("failed", "host_oom_killed", None, None),
    "llama_elastic_exitcode9.log": ("failed", "host_oom_killed", None, None),
    "firefly_bar_sigterm_then_sigkill.log": ("failed", "host_oom_killed", ("Loading checkpoint shards", 0, 2), "weights_loading"),
    "diffusers_disk_full.log": ("failed", "disk_full", None, None),
    "vllm_import_undefined_symbol.log": ("failed", "import_error", None, None),
    # False alarms: a WARNING naming ImportError, request errors of a live server, retries, SIGINT shutdown.
    "vllm_c_import_warning.log": ("running", None, None, None),
    "vllm_request_errors_server_lives.log": ("running", None, None, "serving"),
    "openai_retrying_requests.log": ("running", None, None, None),
    "vllm_shutdown_sigint.log": ("running", None, None, None),
    # the log ends inside the worker's traceback (its exception line cut): a finished file that ends
    # inside a traceback is a failure (issue #15)
    "vllm_v1_worker_exception.log": ("failed", "python_exception", None, None),
    "vllm_stats_apiserver.log": ("running", None, None, None),
    "vllm_specdecode_metrics.log": ("running", None, None, None),
    "vllm_docker_timestamps.log": ("running", None, None, None),
    "vllm_v0_stats_pending.log": ("running", None, None, None),
    "nemo_eagle3_bar_and_log.log": ("running", None, ("Training", 18, 64), None),
    "vllm_omni_interleaved_bars.log": ("running", None, ("Loading safetensors checkpoint shards", 13, 32), "weights_loading"),
    "specforge_hidden_states_bar.log": ("running", None, ("Generating Hidden States", 68, 1250), None),
    "hf_loading_checkpoint_shards.log": ("running", None, ("Loading checkpoint shards", 2, 2), None),
    "lm_eval_duplicate_100.log": ("running", None, ("Loading safetensors checkpoint shards", 30, 30), "weights_loading"),
    "automodel_counting_tokens.log": ("running", None, ("Counting supervised tokens for draft vocab (32000)", 8, 8), None),
    "ray_weights_loading.log": ("running", None, None, None),
}


def test_every_public_fixture_has_an_expectation_and_a_source():
    files = sorted(p.name for p in PUBLIC.glob("*.log"))
    assert files == sorted(EXPECTED)
    sources = (LOGS / "SOURCES.md").read_text()
    for name in files:
        assert f"| {name} | https://github.com/" in sources, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_public_log(name):
    state, reason, bar, phase = EXPECTED[name]
    s = parse_file(PUBLIC / name)
    assert s["schema"] == 1
    assert s["state"] == state
    assert (s["failure"] or {}).get("reason") == reason
    if bar is None:
        pass
    else:
        p = s["progress"]
        assert (p["label"], p["n"], p["total"]) == bar
    assert s["phase"] == phase
    assert s["lines"] == (PUBLIC / name).read_bytes().count(b"\n")
    assert s["bad_lines"] == 0


def test_failure_names_the_line_that_says_it():
    s = parse_file(PUBLIC / "torchrun_childfailed_sigkill.log")
    lines = (PUBLIC / "torchrun_childfailed_sigkill.log").read_text().splitlines()
    assert s["failure"]["line"] == 26
    assert "exitcode  : -9" in lines[s["failure"]["line"] - 1]


def test_slow_shard_load_keeps_the_bar_history_for_the_eta():
    s = parse_file(PUBLIC / "vllm_tp_slow_shards.log", include_history=True)
    (bar,) = s["progress_bars"]
    assert [n for _elapsed, n in bar["history"]] == list(range(22, 34))  # [elapsed_s, n], as progress.history
    assert bar["prefix"] is None and bar["history"][0] == [563.0, 22]
    prog = s["progress"]
    assert prog["rate_s_per_it"] == 31.18 and prog["tqdm_remaining_s"] == 27 * 60 + 1
    # eta_s is eaglelab.eta's estimate from the whole history (issue 4), with its range.
    assert prog["eta_low_s"] <= prog["eta_s"] <= prog["eta_high_s"] and prog["eta_s"] > 0


def test_interleaved_bars_are_kept_apart():
    s = parse_file(PUBLIC / "vllm_omni_interleaved_bars.log", include_history=True)
    bars = {b["label"]: b for b in s["progress_bars"]}
    assert bars["Multi-thread loading shards"]["n"] == 24
    assert [n for _e, n in bars["Loading safetensors checkpoint shards"]["history"]] == [8, 9, 10, 11, 12, 13]


def test_durations_from_the_log_itself():
    s = parse_file(PUBLIC / "vllm_engine_core_startup.log")
    phases = {p["name"]: p for p in s["phases"]}
    assert phases["weights_loading"]["duration_s"] == 1.27          # `Loading weights took 1.27 seconds`
    assert phases["compiling"]["duration_s"] == 3.7                 # `torch.compile takes 3.70 s in total`
    assert phases["engine_init"]["ended_line"] is None


def test_vllm_and_spec_decode_metrics():
    s = parse_file(PUBLIC / "vllm_specdecode_metrics.log")
    assert s["metrics"]["spec/mean_acceptance_length"] == [[0, 4.0], [1, 4.0]]
    assert s["metrics"]["spec/acceptance_rate_pct"] == [[0, 100.0], [1, 100.0]]
    assert s["metrics"]["vllm/gen_tokens_per_s"] == [[0, 37.6], [1, 37.2]]
    d = parse_file(PUBLIC / "vllm_docker_timestamps.log")
    assert d["metrics"]["vllm/running_reqs"] == [[0, 9.0], [1, 9.0], [2, 10.0], [3, 10.0]]


def test_trainer_metric_lines_glued_after_bar_frames():
    s = parse_file(PUBLIC / "nemo_eagle3_bar_and_log.log")
    assert s["metrics"]["train_loss"][0] == [14, 9.117183]
    assert s["progress"]["postfix"]["loss"] == "7.6236"
    assert s["progress"]["unit"] == "step"


def test_lab_parse_json_prints_one_object():
    result = CliRunner().invoke(parse_cmd, [str(PUBLIC / "vllm_multiproc_oom.log"), "--json"])
    assert result.exit_code == 0, result.output
    s = json.loads(result.output)
    assert s["state"] == "failed" and s["failure"]["reason"] == "cuda_oom" and s["failure"]["line"] == 1


def test_lab_parse_names_a_missing_file():
    result = CliRunner().invoke(parse_cmd, ["/nonexistent/output.log", "--json"])
    assert result.exit_code == 2
    assert "'/nonexistent/output.log' does not exist" in result.output


RECORDED = LOGS / "recorded"


def test_recorded_vllm_cpu_server_start_and_stop():
    s = parse_file(RECORDED / "vllm_cpu_tiny_server.log")
    assert s["state"] == "completed" and s["failure"] is None and s["ready"] is True
    names = [p["name"] for p in s["phases"]]
    assert names[0] == "weights_loading" and "serving" in names and names[-1] == "shutdown"
    assert s["progress"]["label"] == "Loading safetensors checkpoint shards"
    assert s["progress"]["n"] == s["progress"]["total"] == 6
    assert "vllm/gen_tokens_per_s" in s["metrics"]
    assert not any(k in s["metrics"] for k in ("world_size", "rank", "local_world_size"))  # setup lines are no metrics


def test_recorded_speculators_training_logging():
    s = parse_file(RECORDED / "speculators_train_logging.log")
    assert s["state"] == "completed"
    assert [p["name"] for p in s["phases"]].count("training") == 2
    assert s["metrics"]["train/loss"] == [[0, 9.0], [1, 4.5], [2, 3.0], [3, 2.25], [4, 1.8], [5, 1.5]]
    assert s["metrics"]["val/loss_epoch"] == [[0, 8.0], [1, 7.0]]
    assert s["metrics"]["train/full_acc_0"][0] == [0, 0.0]
