"""Facts about a host that preflight needs, gathered ON the host in one call.

`python -m eaglelab.host.hostside facts JSON` runs this with the host's own interpreter, so the
packages listed are the ones a stage launched there would import.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
from pathlib import Path

from . import machine, vllm_support


def canonical(name: str) -> str:
    """PEP 503 name: `Flask_Login` and `flask-login` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def packages() -> dict[str, str]:
    """{canonical name: version} of every distribution this interpreter sees."""
    out = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(canonical(name), dist.version)
    return out


def facts(work_dir: str, inputs: list[str], outputs: list[str], cwd: str) -> dict:
    base = Path(cwd).expanduser()
    disk = {p: machine.free_disk(base / p) for p in (outputs or [])}
    disk[work_dir] = machine.free_disk(work_dir)
    drafters = vllm_support.drafters_among(inputs, base)  # a serving stage's drafter: can this vLLM serve it?
    return {"schema": 1, "hostname": platform.node(), "home": str(Path.home()), "python": sys.executable,
            "python_version": platform.python_version(), "packages": packages(),
            "free_disk_bytes": disk, "gpus": machine.gpus(),
            "inputs": machine.inputs_digest(inputs, str(base)) if inputs else {},
            "manifests": manifests(inputs, base), "cwd_exists": base.is_dir(), "pid": os.getpid(),
            "drafters": drafters, "vllm": vllm_support.installed() if drafters else None,
            "model_configs": model_configs(inputs, base)}


CONFIG_MAX_BYTES = 1 << 20  # a model's config.json is a few KB; anything larger is not one


def model_configs(inputs: list[str], base: Path) -> dict[str, dict]:
    """For each input that is a model directory: its config.json and its weights' bytes (*.safetensors), so
    the plan that knows what fits reads the model's own numbers, not the profile's facts file."""
    import json
    out = {}
    for p in inputs or []:
        d = base / p
        path = d / "config.json"
        try:
            if not path.is_file() or path.stat().st_size > CONFIG_MAX_BYTES:
                continue
            cfg = json.loads(path.read_text())
            weights = sum(f.stat().st_size for f in d.glob("*.safetensors"))
        except (OSError, ValueError):
            continue
        if isinstance(cfg, dict):
            out[p] = {"config": cfg, "weight_bytes": weights}
    return out


def manifests(inputs: list[str], base: Path) -> dict[str, dict]:
    """counts and params of each input's manifest.json (the prepared data's token count feeds the
    hidden-states disk estimate)."""
    import json
    out = {}
    for p in inputs or []:
        path = base / p
        if not path.is_dir():
            continue
        path = path / "manifest.json"
        try:
            m = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(m, dict):
            out[p] = {"counts": m.get("counts") or {}, "params": m.get("params") or {}, "extra": m.get("extra") or {}}
    return out
