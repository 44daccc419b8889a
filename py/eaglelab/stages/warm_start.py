"""Warm start: train continues from an existing EAGLE-3 drafter (a path or a hub id), as the seeds
fine-tuned a public Kimi drafter instead of starting from random weights.

The drafter's lm_head has one row per token of ITS draft vocabulary (d2t: draft id i -> target id
i + d2t[i]). speculators loads the weights and then installs the d2t/t2d it is given, so a drafter
whose vocabulary differs from the vocab stage's would train with every row predicting another token.
Hence, before launch: the vocabularies must be the same (`--warm-start-vocab check`, the default),
or the drafter is rebuilt explicitly for the new vocabulary (`rebuild`): lm_head rows are the
drafter's for the tokens both vocabularies hold and the verifier's own lm_head rows for the new
ones, with the new d2t/t2d.

Or (`adopt`) training takes the drafter's own vocabulary: its d2t/t2d, as they are, for this run.

Either way training loads a staged copy (<out>/warm_start/) whose config names THIS target as its
verifier: speculators loads the verifier's embeddings and lm_head from the path in the drafter's
config, which for a public drafter is a hub id (a 1 T download on a host that may have no network).

A drafter in the SpecForge/TorchSpec layout (the public Kimi-K2.5 drafter: a Llama-style config
with `architectures: [LlamaForCausalLMEagle3]`, its decoder layer under `midlayer.*`) is converted
first, with speculators' own Eagle3Converter, into a cache beside train's output.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from ..errors import StageError

WEIGHTS = "model.safetensors"
STAGED = "warm_start"  # under train's --out: the drafter as this training loads it


def resolve(source: str) -> Path:
    """A local drafter directory, or a hub id fetched into the HF cache."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() or not (path / WEIGHTS).is_file():
            raise StageError(f"{path}: --warm-start needs a drafter checkpoint directory (config.json + {WEIGHTS}); "
                             "point warm_start at one (train's output: <checkpoints>/drafter)")
        return path
    if path.exists() or source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise StageError(f"warm_start {source!r}: no such drafter directory, and not a hub id (owner/name); "
                         "fix the warm_start var")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(source, allow_patterns=["config.json", "*.safetensors", "*.py"]))
    except Exception as e:  # noqa: BLE001 - the hub's errors are many; the message says which
        raise StageError(f"warm_start {source!r}: could not fetch it from the hub ({type(e).__name__}: {e}); "
                         "download it where the host can reach it and set warm_start to that directory") from None


def layout(drafter: Path) -> str:
    """'speculators', 'specforge' (convertible by speculators' Eagle3Converter), or what else it says."""
    cfg = json.loads((drafter / "config.json").read_text())
    if cfg.get("speculators_model_type"):
        return "speculators"
    if any("eagle3" in str(a).lower() for a in cfg.get("architectures") or []):
        return "specforge"
    return f"unknown (architectures {cfg.get('architectures')!r}, no speculators_model_type)"


def converted(drafter: Path, verifier: Path, aux_layers: list[int], cache: Path, echo) -> Path:
    """The drafter in speculators' layout: itself, or its conversion (made once, kept in cache by the
    source's fingerprint: a second training does not convert again)."""
    kind = layout(drafter)
    if kind == "speculators":
        return drafter
    if kind != "specforge":
        raise StageError(f"{drafter / 'config.json'}: a drafter layout eaglelab cannot read: {kind}. Fix: convert "
                         "it to speculators' format (`speculators convert`), or point warm_start at a speculators "
                         "EAGLE-3 checkpoint")
    dest = cache / fingerprint(drafter)
    if (dest / "config.json").is_file() and (dest / WEIGHTS).is_file():
        return dest
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    echo(f"train: warm start drafter {drafter} is in the SpecForge/TorchSpec layout; converting it with "
         f"speculators' Eagle3Converter into {dest}")
    part = dest.with_name(dest.name + ".partial")
    if part.exists():
        shutil.rmtree(part)
    Eagle3Converter().convert(drafter, part, base_model=str(verifier), validate=False,
                              eagle_aux_hidden_state_layer_ids=list(aux_layers))
    if dest.exists():
        shutil.rmtree(dest)
    part.rename(dest)  # whole or absent: a killed conversion is redone, never half read
    return dest


def adopt_vocab(drafter: Path, dest: Path) -> Path:
    """The drafter's own d2t/t2d as a vocab directory (what `--warm-start-vocab adopt` trains with)."""
    d2t, t2d = drafter_vocab(drafter)
    dest.mkdir(parents=True, exist_ok=True)
    np.save(dest / "d2t.npy", d2t)
    np.save(dest / "t2d.npy", t2d)
    return dest


def fingerprint(drafter: Path) -> str:
    h = hashlib.sha256()
    for name in ("config.json", WEIGHTS):
        h.update((drafter / name).read_bytes())
    return h.hexdigest()[:16]


def drafter_vocab(drafter: Path) -> tuple[np.ndarray, np.ndarray]:
    from safetensors import safe_open

    with safe_open(str(drafter / WEIGHTS), "np") as f:
        if "d2t" not in f.keys() or "t2d" not in f.keys():
            raise StageError(f"{drafter / WEIGHTS}: no d2t/t2d tensors; a warm start needs an EAGLE-3 drafter "
                             "with a draft vocabulary (speculators format)")
        return f.get_tensor("d2t"), f.get_tensor("t2d")


def targets(d2t: np.ndarray) -> np.ndarray:
    """The target token id of each draft id."""
    return np.arange(len(d2t)) + d2t


def check(drafter: Path, vocab: Path, aux_layers: list[int], hidden_size: int) -> str | None:
    """None when the drafter fits this training as it is; else why not (a sentence naming both sides)."""
    cfg = json.loads((drafter / "config.json").read_text())
    if cfg.get("speculators_model_type") != "eagle3":
        raise StageError(f"{drafter / 'config.json'}: speculators_model_type {cfg.get('speculators_model_type')!r}; "
                         "a warm start needs an eagle3 drafter")
    their_aux = cfg.get("eagle_aux_hidden_state_layer_ids")
    if their_aux is not None and list(their_aux) != list(aux_layers):
        raise StageError(f"{drafter / 'config.json'}: trained on aux layers {their_aux}, this training uses "
                         f"{aux_layers}: its fc weights would read other layers. Fix: set aux_layers to {their_aux} "
                         "(and rerun extract), or train from scratch (warm_start: '')")
    their_hidden = (cfg.get("transformer_layer_config") or {}).get("hidden_size")
    if their_hidden is not None and their_hidden != hidden_size:
        raise StageError(f"{drafter / 'config.json'}: hidden size {their_hidden}, the target's is {hidden_size}: "
                         "a drafter for another model; pick the drafter trained for this target")
    d2t, t2d = drafter_vocab(drafter)
    ours_d2t, ours_t2d = np.load(vocab / "d2t.npy"), np.load(vocab / "t2d.npy")
    if len(t2d) != len(ours_t2d):
        raise StageError(f"{drafter}: drafts for a target vocabulary of {len(t2d):,} tokens, this target has "
                         f"{len(ours_t2d):,}: a drafter for another tokenizer; pick the one for this target")
    if len(d2t) == len(ours_d2t) and np.array_equal(d2t, ours_d2t):
        return None
    shared = np.intersect1d(targets(d2t), targets(ours_d2t)).size
    return (f"the drafter {drafter} drafts {len(d2t):,} tokens, {vocab / 'd2t.npy'} {len(ours_d2t):,} "
            f"({shared:,} in both, {len(ours_d2t) - shared:,} new)")


def stage(drafter: Path, vocab: Path, verifier: Path, out: Path, rebuild: bool) -> Path:
    """The drafter as this training loads it: config pointing at this verifier; weights linked as they
    are, or (rebuild) with lm_head rows remapped to the vocab stage's vocabulary."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for p in drafter.iterdir():  # config and its code; not a run's optimizer state
        if p.is_file() and p.name in ("config.json", "config.py", "generation_config.json"):
            shutil.copy2(p, out / p.name)
    cfg = json.loads((out / "config.json").read_text())
    cfg.setdefault("speculators_config", {}).setdefault("verifier", {})["name_or_path"] = str(verifier.resolve())
    record = {"drafter": str(drafter), "drafter_fingerprint": fingerprint(drafter), "vocab": str(vocab),
              "rebuilt": rebuild}
    if rebuild:
        d2t = np.load(vocab / "d2t.npy")
        cfg["draft_vocab_size"] = len(d2t)
        record.update(_rebuilt_weights(drafter, vocab, verifier, out / WEIGHTS))
    else:
        (out / WEIGHTS).symlink_to((drafter / WEIGHTS).resolve())
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "staged_from.json").write_text(json.dumps(record, indent=2))
    return out


def _rebuilt_weights(drafter: Path, vocab: Path, verifier: Path, dest: Path) -> dict:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    d2t_old, _ = drafter_vocab(drafter)
    d2t, t2d = np.load(vocab / "d2t.npy"), np.load(vocab / "t2d.npy")
    with safe_open(str(drafter / WEIGHTS), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    old_rows = {int(t): i for i, t in enumerate(targets(d2t_old))}
    new_targets = [int(t) for t in targets(d2t)]
    missing = [t for t in new_targets if t not in old_rows]
    verifier_rows = verifier_lm_head_rows(verifier, missing) if missing else {}
    head = tensors["lm_head.weight"]
    rows = [head[old_rows[t]] if t in old_rows else verifier_rows[t].to(head.dtype) for t in new_targets]
    tensors.update({"lm_head.weight": torch.stack(rows).contiguous(), "d2t": torch.from_numpy(d2t),
                    "t2d": torch.from_numpy(t2d)})
    save_file(tensors, str(dest), metadata={"format": "pt"})
    return {"kept_rows": len(new_targets) - len(missing), "rows_from_verifier": len(missing)}


def verifier_lm_head_rows(verifier: Path, ids: list[int]):
    """{target id: row} of the verifier's lm_head (found through its safetensors index, one shard read)."""
    from safetensors import safe_open

    index = verifier / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        key = lm_head_key(weight_map, verifier)
        files = [verifier / weight_map[key]]
    else:
        files = sorted(verifier.glob("*.safetensors"))
        key = None
    for path in files:
        with safe_open(str(path), "pt") as f:
            try:
                name = key or lm_head_key(f.keys(), verifier)
            except StageError:
                continue  # not in this file (no index to say which one holds it)
            head = f.get_slice(name)
            return {i: head[i:i + 1][0] for i in ids}
    raise StageError(f"{verifier}: no lm_head weight in its safetensors; rebuilding a warm start drafter's "
                     "vocabulary needs the verifier's lm_head for the new tokens")


def lm_head_key(names, verifier: Path) -> str:
    """The verifier's output head among its weight names: `lm_head.weight`, or under the model's own
    prefix (Kimi-K2.5, a vision-language model, keeps `language_model.lm_head.weight`), or with tied
    embeddings the input embedding."""
    names = list(names)
    for want in ("lm_head.weight", "embed_tokens.weight"):
        found = sorted((n for n in names if n == want or n.endswith("." + want)), key=len)
        if want == "embed_tokens.weight" and found:
            cfg = verifier / "config.json"
            tied = cfg.is_file() and _tied(json.loads(cfg.read_text()))
            if not tied:
                break
        if found:
            return found[0]
    raise StageError(f"{verifier}: no lm_head.weight (nor *.lm_head.weight, nor tied embeddings) among its "
                     f"{len(names)} weights; rebuilding a warm start drafter's vocabulary needs the verifier's "
                     "lm_head for the new tokens")


def _tied(cfg: dict) -> bool:
    return bool(cfg.get("tie_word_embeddings") or (cfg.get("text_config") or {}).get("tie_word_embeddings"))
