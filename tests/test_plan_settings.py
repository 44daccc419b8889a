"""`lab plan` shows each job with its key settings and those of the services it needs."""

from __future__ import annotations

import pytest

from eaglelab.control.pipeline.plan import key_settings


@pytest.mark.parametrize("argv, shown", [
    (["py", "-m", "eaglelab.stages.synth", "--endpoint", "http://127.0.0.1:8100", "--prompts", "data/p.jsonl",
      "--concurrency", "64", "--max-tokens", "16384", "--reasoning", "--trust-remote-code"],
     "concurrency=64 max-tokens=16384 reasoning trust-remote-code"),
    (["py", "-m", "eaglelab.stages.serve", "--max-model-len", "20480", "--vllm-args", "--max-num-seqs 64",
      "--aux-layers", "2 30 58", "--vllm-args", ""],
     "max-model-len=20480 vllm-args='--max-num-seqs 64' aux-layers='2 30 58'"),
    (["py", "--warm-start", "lightseekorg/kimi-k2.5-eagle3", "--out", "data/x/checkpoints", "--no-trust-remote-code"],
     "warm-start=lightseekorg/kimi-k2.5-eagle3 no-trust-remote-code"),
])
def test_key_settings_table(argv, shown):
    assert key_settings(argv) == shown


def test_lab_plan_kimi_shows_each_stage_with_its_settings():
    import os
    import subprocess

    from conftest import LAB, REPO
    env = dict(os.environ, EAGLELAB_CONF=str(REPO / "conf"), EAGLELAB_PROFILE="kimi-k2.5")
    p = subprocess.run([str(LAB), "plan"], capture_output=True, text=True, env=env, timeout=180)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()

    def settings_of(stage: str) -> str:
        i = next(n for n, line in enumerate(lines) if line.startswith(stage + " "))
        return lines[i + 1]

    for stage, needles in {
        "synth": ["max-tokens=16384", "concurrency=64", "needs serve_synth:", "tensor-parallel=8",  # the engine check's
                  "max-model-len=20480", "--reasoning-parser kimi_k2"],
        "prepare": ["seq-length=18432"],
        "extract": ["aux-layers='2 30 58'", "needs serve_extract:"],
        "vocab": ["draft-vocab-size=32000"],
        "train": ["epochs=10", "total-seq-len=18432", "gpus=1", "seed=42", "warm-start=lightseekorg/kimi-k2.5-eagle3", "warm-start-vocab=adopt", "lr=2e-5"],
        "pilot": ["warm-start=lightseekorg/kimi-k2.5-eagle3", "warm-start-vocab=adopt"],  # the forecast of this very start
        "eval": ["needs serve_eval:", "num-speculative-tokens=3", "rounds=4"],
    }.items():
        got = settings_of(stage)
        for needle in needles:
            assert needle in got, (stage, needle, got)
