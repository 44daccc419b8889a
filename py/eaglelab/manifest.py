"""The small `manifest.json` every stage writes next to its outputs.

A manifest says what a stage produced (files, sizes, counts), with which parameters, and a
fingerprint over both, so that the next stage can check its inputs and `lab run` can tell a
finished stage from a half-done one without re-reading gigabytes. Small files are hashed (sha256);
big ones (hidden states run to hundreds of GB) are fingerprinted by name and size only.

Layout (schema 1):
  {"schema": 1, "stage": "vocab", "created_at": "...", "params": {...}, "counts": {...},
   "files": {"d2t.npy": {"size": 8, "sha256": "..."}, ...}, "total_bytes": 123,
   "fingerprint": "sha256 of params + files", "extra": {...}, "run_id": "vocab-20261204T…" }
`run_id` (when written under jobwrap, from EAGLELAB_RUN_ID) names the run that wrote it: a run whose
wrapper died is `completed` when every output carries a sound manifest of its own run_id
(eaglelab.host.hostside.outputs_done), not redone.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import StageError
from .fsutil import atomic_write_json, read_json, utcnow_iso

NAME = "manifest.json"
HASH_LIMIT = 16 * 1024 * 1024  # files up to this size are hashed; bigger ones: name + size


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def describe_files(root: Path, files: Iterable[Path], hash_limit: int = HASH_LIMIT) -> dict[str, dict]:
    """{relative name: {size, sha256?}} for files under root, in sorted order."""
    out: dict[str, dict] = {}
    for p in sorted(set(files)):
        size = p.stat().st_size
        entry: dict[str, Any] = {"size": size}
        if size <= hash_limit:
            entry["sha256"] = sha256_file(p)
        out[str(p.relative_to(root))] = entry
    return out


def fingerprint(params: dict, files: dict[str, dict], counts: dict | None = None) -> str:
    blob = json.dumps({"params": params, "files": files, "counts": counts or {}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def write(out_dir: str | Path, stage: str, files: Iterable[Path], params: dict | None = None,
          counts: dict | None = None, extra: dict | None = None, hash_limit: int = HASH_LIMIT,
          name: str = NAME) -> dict:
    """Describe `files` (all under out_dir) and write out_dir/<name> (manifest.json) atomically."""
    out_dir = Path(out_dir)
    described = describe_files(out_dir, [Path(f) for f in files], hash_limit)
    params = params or {}
    doc = {"schema": 1, "stage": stage, "created_at": utcnow_iso(), "params": params,
           "counts": counts or {}, "files": described,
           "total_bytes": sum(e["size"] for e in described.values()),
           "fingerprint": fingerprint(params, described, counts), "extra": extra or {}}
    if os.environ.get("EAGLELAB_RUN_ID"):  # the run that wrote it (jobwrap sets it for every stage)
        doc["run_id"] = os.environ["EAGLELAB_RUN_ID"]
    atomic_write_json(out_dir / name, doc)
    return doc


def read(out_dir: str | Path, name: str = NAME) -> dict | None:
    """The manifest in out_dir, or None if absent or unreadable."""
    doc = read_json(Path(out_dir) / name)
    return doc if isinstance(doc, dict) and doc.get("schema") == 1 else None


def problems(out_dir: str | Path, doc: dict | None = None) -> list[str]:
    """What is wrong with out_dir against its manifest (missing files, changed sizes); [] if sound.

    Sizes only: re-hashing every file on every check would cost as much as the stage on big
    outputs; a truncated file (the common failure) changes its size.
    """
    out_dir = Path(out_dir)
    doc = doc if doc is not None else read(out_dir)
    if doc is None:
        return [f"{out_dir / NAME}: no manifest"]
    bad = []
    for name, entry in doc.get("files", {}).items():
        p = out_dir / name
        if not p.is_file():
            bad.append(f"{p}: listed in {out_dir / NAME} but missing")
        elif p.stat().st_size != entry.get("size"):
            bad.append(f"{p}: size {p.stat().st_size} != {entry.get('size')} in {out_dir / NAME}")
    return bad


def is_complete(out_dir: str | Path, params: dict | None = None, name: str = NAME) -> bool:
    """True when out_dir has a sound manifest written with these params (idempotent skip)."""
    doc = read(out_dir, name)
    if doc is None or problems(out_dir, doc):
        return False
    return params is None or doc.get("params") == json.loads(json.dumps(params))


def require(out_dir: str | Path, stage: str, fix: str) -> dict:
    """The manifest of an input produced by `stage`; StageError naming the file and the fix if unsound."""
    out_dir = Path(out_dir)
    doc = read(out_dir)
    if doc is None:
        raise StageError(f"{out_dir / NAME}: missing or unreadable; the {stage!r} stage has not "
                         f"finished. Fix: {fix}")
    if doc.get("stage") != stage:
        raise StageError(f"{out_dir / NAME}: written by stage {doc.get('stage')!r}, expected {stage!r}. "
                         f"Fix: {fix}")
    bad = problems(out_dir, doc)
    if bad:
        raise StageError(f"{out_dir / NAME}: outputs do not match the manifest: {'; '.join(bad[:5])}. "
                         f"Fix: {fix}")
    return doc


def set_aside(out_dir: str | Path) -> Path:
    """Rename out_dir (made with other inputs or settings) to <out_dir>.stale-<fingerprint>, so a
    rerun neither mixes old and new outputs nor deletes anything (hidden states can be 800 GB:
    the user decides). Returns the new name."""
    out_dir = Path(out_dir)
    doc = read(out_dir) or {}
    base = out_dir.with_name(f"{out_dir.name}.stale-{doc.get('fingerprint') or 'partial'}")
    dest, n = base, 1
    while dest.exists():
        dest, n = base.with_name(f"{base.name}.{n}"), n + 1
    out_dir.rename(dest)
    return dest


CLAIM = ".params.json"  # written when a stage starts writing into a directory


def claim(out_dir: str | Path, stage: str, params: dict, may_move: bool = True) -> Path | None:
    """Before a stage writes into out_dir: if a finished (manifest) or interrupted (claim) earlier run
    used other params, set the directory aside (so a resume never mixes two runs' outputs); then
    record ours. Returns where the old outputs went, or None."""
    out_dir = Path(out_dir)
    params = json.loads(json.dumps(params))
    moved = None
    if out_dir.exists():
        doc = read(out_dir) or read_json(out_dir / CLAIM)
        if isinstance(doc, dict) and doc.get("params") != params:
            if not may_move:
                raise StageError(f"{out_dir}: holds outputs made with {doc.get('params')}, not {params}; "
                                 f"move it away (on every host that shares it), then run again")
            moved = set_aside(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / CLAIM, {"schema": 1, "stage": stage, "params": params})
    return moved
