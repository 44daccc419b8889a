"""Preflight: the pure estimators and comparisons as tables, then the checks against real hosts."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from eaglelab.config import StageConfig
from eaglelab.control.pipeline import preflight
from eaglelab.errors import StageError

KIMI_HIDDEN = 7168  # Kimi-K2.5, the seeds' target
SEEDS_AUX = "2,30,58"  # three aux layers (+ the last layer)


# -- the disk estimate ---------------------------------------------------------------------------

@pytest.mark.parametrize("tokens, aux, hidden, expected", [
    (8192, 3, 4096, 268_435_456),  # the library's docs: 8192 × 4 × 4096 × 2 ≈ 268 MB per sample (8B model)
    (502_983, 3, KIMI_HIDDEN, 28_843_057_152),  # the seeds' 1000-sample run, which wrote 27 GB (GiB)
    (0, 3, 4096, 0),
    (10, 0, 16, 320),
])
def test_hidden_states_bytes(tokens, aux, hidden, expected):
    assert preflight.hidden_states_bytes(tokens, aux, hidden) == expected


def test_seeds_1000_sample_run_is_27_gib():
    est = preflight.hidden_states_bytes(502_983, 3, KIMI_HIDDEN)
    assert round(est / 2**30) == 27


def extract_stage(**kw) -> StageConfig:
    return StageConfig(name="extract", host="h", command=["x"], outputs=["data/hidden_states"], **kw)


def test_estimate_for_the_seeds_828_gb_run_from_the_prepared_manifest():
    # 10,000 samples averaging 1,444 tokens: Σ seq_len as the prepared data's manifest counts it
    manifests = {"data/prepared": {"counts": {"samples": 10_000, "tokens": 14_439_732}}}
    est, how = preflight.estimate_output_bytes(extract_stage(), {"hidden_size": "7168", "aux_layers": SEEDS_AUX},
                                               manifests)
    assert abs(est - 828e9) / 828e9 < 1e-4
    assert "14,439,732 tokens" in how and "data/prepared/manifest.json counts.tokens" in how and "(3 aux + 1)" in how


@pytest.mark.parametrize("variables, manifests, expected", [
    ({"hidden_size": "16", "aux_layers": "3", "total_tokens": "100"}, {}, 100 * 4 * 16 * 2),
    ({"hidden_size": "16", "aux_layers": "[2, 5]", "total_tokens": "100"}, {}, 100 * 3 * 16 * 2),
    ({"hidden_size": "16", "num_samples": "10", "seq_length": "50"}, {}, 500 * 4 * 16 * 2),  # default 3 aux
    ({"hidden_size": "16", "total_tokens": "1"}, {"in": {"counts": {"total_tokens": 7}}}, 7 * 4 * 16 * 2),
    ({"hidden_size": "16", "synth_limit": "10", "seq_length": "50", "aux_layers": "2 16 29"}, {}, 500 * 4 * 16 * 2),
    ({"aux_layers": "2 30 58"}, {"prepared": {"counts": {"tokens": 9}, "extra": {"hidden_size": 7168}}},
     9 * 4 * 7168 * 2),  # hidden size from the prepare stage's manifest
    ({"total_tokens": "100"}, {}, None),  # no hidden size: no guess
    ({"hidden_size": "16"}, {}, None),  # no token count
])
def test_estimate_sources(variables, manifests, expected):
    assert preflight.estimate_output_bytes(extract_stage(), variables, manifests)[0] == expected


def test_no_estimate_for_a_stage_without_hidden_states():
    stage = StageConfig(name="train", host="h", command=["x"], outputs=["ckpt"])
    assert preflight.estimate_output_bytes(stage, {"hidden_size": "16", "total_tokens": "9"}, {})[0] is None


# -- the lock and the packages -------------------------------------------------------------------

def test_parse_lock_and_diff():
    lock = preflight.parse_lock("# pinned\nFlask==3.1.3\ntyping_extensions==4.15.0 ; python_version>'3'\n"
                                "-e .\n\nuvicorn[standard]==0.40.0\n")
    assert lock == {"flask": "3.1.3", "typing-extensions": "4.15.0", "uvicorn": "0.40.0"}
    installed = {"Flask": "3.1.3", "typing-extensions": "4.14.0", "extra-thing": "1"}
    assert preflight.diff_packages(lock, installed) == [("typing-extensions", "4.15.0", "4.14.0"),
                                                        ("uvicorn", "0.40.0", None)]


def test_parse_lock_refuses_a_range():
    with pytest.raises(StageError, match=r"x.lock:2: 'torch>=2' is not `name==version`"):
        preflight.parse_lock("a==1\ntorch>=2\n", "x.lock")


@pytest.mark.parametrize("need, mem, gpus, ok", [
    (0, None, None, True),
    (1, None, None, False),  # a host without nvidia-smi
    (2, 40_000, [{"memory_total_mib": 81_559, "memory_used_mib": 4}] * 2, True),
    (2, 40_000, [{"memory_total_mib": 81_559, "memory_used_mib": 4},
                 {"memory_total_mib": 97_871, "memory_used_mib": 93_184}], False),  # the seeds' GPU 0
])
def test_check_gpus(need, mem, gpus, ok):
    assert preflight.check_gpus(need, mem, gpus, "h").ok is ok


# hostside.gpus() on a real H200 host (the device machine, 2026-11-29): nvidia-smi's view, parsed there
H200 = [{"index": 0, "name": "NVIDIA H200", "utilization_pct": 0.0, "memory_used_mib": 0.0,
         "memory_total_mib": 143771.0}]


@pytest.mark.parametrize("need, mem, util, ok", [(1, None, 0.85, True), (2, None, 0.85, False),
                                                 (1, 200_000, None, False), (1, 140_000, None, True)])
def test_check_gpus_on_a_recorded_h200(need, mem, util, ok):
    assert preflight.check_gpus(need, mem, H200, "h200", utilization=util).ok is ok


def test_check_gpus_by_vllm_utilization():
    seeds_gpu0 = {"memory_total_mib": 97_871, "memory_used_mib": 93_184}  # 91 of 95 GB held by weights
    idle = {"memory_total_mib": 97_871, "memory_used_mib": 500}
    assert preflight.check_gpus(2, None, [idle, idle], "h", utilization=0.85).ok is True
    c = preflight.check_gpus(2, None, [seeds_gpu0, idle], "h", utilization=0.85)
    assert c.ok is False and "1 of 2 GPU(s)" in c.detail and "85%" in c.detail


# -- against real hosts --------------------------------------------------------------------------

def test_disk_too_small_fails_with_both_numbers_and_blocks_the_launch(sshlab, tmp_path: Path):
    data = tmp_path / "data"
    (data / "prepared").mkdir(parents=True)
    (data / "prepared" / "manifest.json").write_text(json.dumps(
        {"schema": 1, "stage": "prepare", "counts": {"samples": 10_000, "tokens": 14_439_732}}))
    sshlab.write({"extract": {"host": "h1", "command": ["true"], "inputs": ["${data}/prepared"],
                              "outputs": ["${data}/hidden_states"]}},
                 hosts=["h1"], vars={"data": str(data), "hidden_size": "7168", "aux_layers": SEEDS_AUX})
    free = shutil.disk_usage(tmp_path).free
    assert free < 828e9, "this test needs a disk with less than 828 GB free"
    p = sshlab.lab("preflight", "extract", check=False)
    assert p.returncode == 1
    disk = next(line for line in p.stdout.splitlines() if " disk " in f" {line} ")
    assert disk.startswith("FAIL") and "estimated output 828,031,991,808 B" in disk, disk
    shown_free = int(re.search(r"free ([\d,]+) B", disk).group(1).replace(",", ""))
    assert abs(shown_free - free) < 0.05 * free, (shown_free, free)  # the host's own figure, the same disk
    assert "PASS host" in p.stdout and "PASS inputs" in p.stdout
    run = sshlab.lab("run", "extract", check=False)
    assert run.returncode == 1 and "preflight failed" in run.stderr and "disk" in run.stderr
    assert not (sshlab.net.home("h1") / "work" / tmp_path.name / "runs").exists()  # nothing was launched
    # the escape hatch launches anyway
    env_run = sshlab.popen("run", "extract", "--quiet", env_extra={"EAGLELAB_NO_PREFLIGHT": "1"})
    assert env_run.wait(timeout=120) == 0


def test_env_differing_from_the_lock_names_the_packages(sshlab, tmp_path: Path):
    from importlib.metadata import version
    lock = tmp_path / "host.lock"
    lock.write_text("click==0.0.1\nno-such-package==1.0\nclick-extra-pin==2.0\n")
    sshlab.write({"s": {"host": "h2", "command": ["true"]}}, hosts=["h2"], lock=str(lock))
    p = sshlab.lab("preflight", "s", "--json", check=False)
    assert p.returncode == 1
    env = next(c for c in json.loads(p.stdout)["checks"] if c["name"] == "env")
    assert env["verdict"] == "FAIL"
    assert f"click (lock 0.0.1, host {version('click')})" in env["detail"]
    assert "no-such-package (lock 1.0, host missing)" in env["detail"] and "lab sync h2" in env["fix"]


def test_missing_input_and_unreachable_host(sshlab, tmp_path: Path):
    sshlab.write({"s": {"host": "h3", "command": ["true"], "inputs": [str(tmp_path / "nope")], "gpus": 1}},
                 hosts=["h3"])
    p = sshlab.lab("preflight", "s", check=False)
    assert p.returncode == 1
    assert any(line.startswith("FAIL inputs") and str(tmp_path / "nope") in line for line in p.stdout.splitlines())
    assert any(line.startswith("FAIL gpus") and "has none" in line for line in p.stdout.splitlines())
    sshlab.net.cut("h3")
    try:
        p = sshlab.lab("preflight", "s", check=False)
    finally:
        sshlab.net.restore("h3")
    assert p.returncode == 1 and p.stdout.startswith("FAIL host") and "ssh" in p.stdout
