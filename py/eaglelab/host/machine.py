"""The machine a host runs on, as preflight and the status page see it: its GPUs (nvidia-smi) and
which runs hold them, free disk, and a cheap digest of a stage's inputs. Runs on the host."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from eaglelab.model import RunState


def gpus() -> list[dict] | None:
    """nvidia-smi's view of the GPUs, or None on a host without them."""
    if not shutil.which("nvidia-smi"):
        return None
    fields = ["index", "name", "utilization.gpu", "memory.used", "memory.total", "uuid"]
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    result = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == len(fields):
            idx, name, util, used, total, uuid = parts
            result.append({"index": int(idx), "name": name, "utilization_pct": _num(util),
                           "memory_used_mib": _num(used), "memory_total_mib": _num(total), "uuid": uuid})
    return result


def _num(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def inputs_digest(paths: list[str], cwd: str = ".") -> dict[str, str]:
    """A cheap fingerprint of each input: its manifest.json when the stage that made it wrote one
    (content hash), else sizes and mtimes; "missing" when absent. Read where the data is."""
    out = {}
    for p in paths:
        path = Path(cwd, p).expanduser()
        manifest = path / "manifest.json" if path.is_dir() else None
        if manifest is not None and manifest.is_file():
            out[p] = "manifest:" + hashlib.sha256(manifest.read_bytes()).hexdigest()[:16]
        elif path.is_file():
            st = path.stat()
            out[p] = f"file:{st.st_size}:{st.st_mtime_ns}"
        elif path.is_dir():
            count = size = newest = 0
            for f in path.rglob("*"):
                if f.is_file():
                    st = f.stat()
                    count, size, newest = count + 1, size + st.st_size, max(newest, st.st_mtime_ns)
            out[p] = f"dir:{count}:{size}:{newest}"
        else:
            out[p] = "missing"
    return out


def mark_gpu_holders(devices: list[dict], runs: list[dict]) -> None:
    """gpus[*].runs: the running runs whose process group has a compute process on that GPU;
    gpus[*].other_processes: compute processes of no run (another user's, or a lost stage's)."""
    groups = {r.get("pgid"): r["id"] for r in runs if r.get("state") == RunState.RUNNING and r.get("pgid")}
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    by_uuid = {g.get("uuid"): g for g in devices}
    for g in devices:
        g.update(runs=[], other_processes=0)
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or parts[0] not in by_uuid:
            continue
        g = by_uuid[parts[0]]
        try:
            run_id = groups.get(os.getpgid(int(parts[1])))
        except (ValueError, ProcessLookupError, PermissionError):
            run_id = None  # another container's pid, or it just ended
        if run_id is None:
            g["other_processes"] += 1
        elif run_id not in g["runs"]:
            g["runs"].append(run_id)


def free_disk(path: str | os.PathLike) -> int:
    """Free bytes on the filesystem that holds path (or would, once it exists)."""
    p = Path(path).expanduser().resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


CONTENT_HASH_BUDGET = 256 * 1024 * 1024  # bytes of small files a content key hashes at most


def paths_info(paths: list[str], cwd: str = ".") -> dict[str, dict]:
    """What a transfer needs to know of each path, here: present?, a directory?, bytes, files, a
    content key equal on two hosts exactly when they hold the same data (a stage's manifest.json
    when it wrote one, else names + sizes + sha256 of the small files: never mtimes, which a copy
    may not keep), what is wrong against the manifest, and the free disk where it goes."""
    from eaglelab import manifest  # its errors take click: not every host-side import needs them
    out = {}
    for p in paths:
        path = Path(cwd, p).expanduser()
        info: dict = {"exists": path.exists(), "is_dir": path.is_dir(), "bytes": 0, "files": 0,
                      "free_bytes": free_disk(path), "problems": []}
        if path.is_file():
            files = [path]
        elif path.is_dir():
            files = sorted(f for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        else:
            files = []
        h, budget = hashlib.sha256(), CONTENT_HASH_BUDGET
        doc = manifest.read(path) if path.is_dir() else None
        for f in files:
            size = f.stat().st_size
            info["bytes"] += size
            info["files"] += 1
            rel = "." if f == path else str(f.relative_to(path))
            entry = f"{rel}\0{size}"
            if doc is None and size <= manifest.HASH_LIMIT and budget >= size:
                entry += "\0" + manifest.sha256_file(f)
                budget -= size
            h.update(entry.encode() + b"\n")
        if doc is not None:  # the manifest speaks for the files it lists (and their sizes are checked)
            info["key"] = "manifest:" + hashlib.sha256((path / manifest.NAME).read_bytes()).hexdigest()[:16]
            info["problems"] = manifest.problems(path, doc)
        else:
            info["key"] = "files:" + h.hexdigest()[:16] if files else "missing"
        out[p] = info
    return out


def inside_roots(paths: list[str], roots: list[str], cwd: str = ".") -> dict:
    """Each path and data root resolved here (~ and symlinks as this host sees them), and the root
    each path lies strictly inside, or None: what a transfer may mirror onto with --delete."""
    def real(p: str) -> str:
        return os.path.realpath(os.path.join(cwd, os.path.expanduser(p)))
    resolved_roots = [real(r) for r in roots]
    out = {}
    for p in paths:
        r = real(p)
        root = next((root for root in resolved_roots
                     if root != "/" and r.startswith(root.rstrip("/") + "/")), None)
        out[p] = {"resolved": r, "root": root}
    return {"paths": out, "roots": resolved_roots}


def read_manifests(paths: list[str], cwd: str = ".") -> dict[str, dict | None]:
    """The manifest.json of each output directory here (what `lab summary` shows), None if absent."""
    from eaglelab import manifest  # its errors take click: not every host-side import needs them
    out: dict[str, dict | None] = {}
    for p in paths:
        path = Path(cwd, p).expanduser()
        doc = manifest.read(path) if path.is_dir() else None
        out[p] = {k: doc.get(k) for k in ("stage", "counts", "total_bytes", "extra", "created_at")} if doc else None
    return out
