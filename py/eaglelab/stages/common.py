"""Checks and small helpers shared by the stage scripts (pure where possible; errors name the fix).

The aux layer ids are the one setting that must agree across extraction, training and serving
(a mismatch collapses acceptance to ~1%): they are spelt here once, WITHOUT the last layer (which
extraction appends and training adds by itself), as speculators' `--target-layer-ids` expects.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import StageError


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def model_config(model: Path | str) -> dict:
    """The target's config.json (the text config for multimodal models)."""
    path = Path(model) / "config.json"
    if not path.is_file():
        raise StageError(f"{path}: not found; --model must be a model directory with a config.json "
                         "(run the model stage, or point the profile's `model` var at the checkpoint)")
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise StageError(f"{path}: not valid JSON ({e}); re-download or rebuild the model") from None
    cfg = cfg.get("text_config", cfg)
    for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
        if not isinstance(cfg.get(key), int):
            raise StageError(f"{path}: key {key!r} missing or not an integer; is this a causal LM checkpoint?")
    return cfg


def parse_layers(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise StageError(f"{flag} {text!r}: expected space-separated integers, e.g. '2 16 29'") from None


def default_aux_layers(num_layers: int) -> list[int]:
    """speculators' default [2, L//2, L-3], de-duplicated (it repeats ids on very small models)."""
    ids = sorted({min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 1)})
    return ids


def check_aux_layers(layers: list[int], num_layers: int, flag: str) -> None:
    if not layers:
        raise StageError(f"{flag}: no layer ids; give e.g. '{' '.join(map(str, default_aux_layers(num_layers)))}'")
    if len(set(layers)) != len(layers) or any(not 0 <= i < num_layers for i in layers):
        raise StageError(f"{flag} {layers}: ids must be distinct and in [0, {num_layers}) for a "
                         f"{num_layers}-layer target (the last layer {num_layers} is added by itself)")


def check_drafter(ckpt: Path, target_cfg: dict, aux_layers: list[int] | None) -> dict:
    """The drafter checkpoint's config, after checking it fits the target it will serve with."""
    path = ckpt / "config.json"
    if not path.is_file():
        raise StageError(f"{path}: not found; --drafter must be a trained checkpoint directory "
                         "(run the train stage; checkpoints are <save-path>/<epoch>/)")
    try:
        cfg = json.loads(path.read_text())
    except ValueError as e:
        raise StageError(f"{path}: not valid JSON ({e}); the checkpoint is damaged (rerun train)") from None
    if not isinstance(cfg, dict):
        raise StageError(f"{path}: a JSON {type(cfg).__name__}, not an object; the checkpoint is damaged (rerun train)")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    if aux_layers is not None and ids is not None and list(ids) != list(aux_layers):
        raise StageError(f"{path}: eagle_aux_hidden_state_layer_ids {ids} != aux layers {aux_layers} used for "
                         "extraction; acceptance would collapse. Fix: retrain with the same --aux-layers")
    if not list(ckpt.glob("*.safetensors")):
        raise StageError(f"{ckpt}: no *.safetensors weights; the checkpoint is incomplete (rerun train)")
    tl = cfg.get("transformer_layer_config", {})
    if tl.get("hidden_size") not in (None, target_cfg["hidden_size"]):
        raise StageError(f"{path}: drafter hidden_size {tl.get('hidden_size')} != target's "
                         f"{target_cfg['hidden_size']}; it was trained for another target")
    return cfg


def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """Rows of a JSONL file and the count of unreadable lines (skipped, never fatal)."""
    rows, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if isinstance(obj, dict):
                rows.append(obj)
            else:
                bad += 1
    return rows, bad


# ---- names one stage writes and another reads (here, so that stages need not import each other) ----

SERVER_INFO = "extract_server.json"  # written into --hidden-states-path by serve's mode extract; extract reads it
TRIMMED_DATA = "dataset"  # extract's <out>/dataset: the prepared rows, those at the cap trimmed (when any is)


def extraction_layers(aux_layers: list[int], num_layers: int) -> list[int]:
    """The layer ids vLLM extracts: the aux layers, then the last layer (what training expects)."""
    check_aux_layers(aux_layers, num_layers, "--aux-layers")
    return [*aux_layers, num_layers]


def hs_path(out: Path, idx: int) -> Path:
    """Extract's hidden states of sample idx (train reads them)."""
    return out / f"hs_{idx}.safetensors"


def completed_epochs(save_path: Path) -> list[int]:
    """Train's epoch checkpoints that are whole (config + weights), ascending."""
    if not save_path.is_dir():
        return []
    done = []
    for d in save_path.iterdir():
        if d.is_dir() and not d.is_symlink() and re.fullmatch(r"\d+", d.name):
            if (d / "config.json").is_file() and (d / "model.safetensors").is_file():
                done.append(int(d.name))
    return sorted(done)
