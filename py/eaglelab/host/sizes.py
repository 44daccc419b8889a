"""How big a stage's input is, measured ON the host where it lies, cheaply (for first-run ETAs:
size x a throughput prior, docs/interfaces.md "ETA"). Never reads gigabytes: a manifest's counts,
a file's bytes, a text file's lines (the first LINE_SAMPLE_BYTES counted, the rest extrapolated)."""

from __future__ import annotations

import json
from pathlib import Path

LINE_SAMPLE_BYTES = 64 << 20  # lines of a bigger file are estimated from its first 64 MiB
UNITS = ("samples", "tokens", "bytes", "lines", "items")


def measure(path: str, unit: str, count: str | None = None, cwd: str = ".") -> dict:
    """{"size": N, "how": "..."} or {"size": None, "reason": "..."} for one input.

    A directory with a manifest.json: its counts[count or unit] (bytes: its total_bytes); a plain
    directory: bytes only; a file: bytes, or its lines for samples/lines (one JSON row a line)."""
    p = Path(path).expanduser()  # "~/x" is the host user's home, wherever cwd is
    if not p.is_absolute():
        p = Path(cwd).expanduser() / p
    key = count or unit
    if not p.exists():
        return {"size": None, "reason": f"{path} is not there yet"}
    if p.is_dir():
        m = _manifest(p)
        if m is not None:
            counts = m.get("counts") or {}
            if unit == "bytes" and count is None and isinstance(m.get("total_bytes"), (int, float)):
                return {"size": float(m["total_bytes"]), "how": f"{path}/manifest.json total_bytes"}
            v = counts.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return {"size": float(v), "how": f"{path}/manifest.json counts.{key}"}
            if unit != "bytes":
                return {"size": None, "reason": f"{path}/manifest.json has no counts.{key} "
                                                f"(it has: {', '.join(sorted(counts)) or 'none'})"}
        if unit == "bytes":
            return {"size": float(sum(f.stat().st_size for f in p.rglob("*") if f.is_file())),
                    "how": f"bytes of the files under {path}"}
        return {"size": None, "reason": f"{path} is a directory without a manifest.json: only its bytes "
                                        f"can be measured, not {unit}"}
    size = p.stat().st_size
    if unit == "bytes":
        return {"size": float(size), "how": f"bytes of {path}"}
    if unit in ("samples", "lines"):
        return {"size": float(_lines(p, size)), "how": f"lines of {path}"
                + (" (estimated from its first 64 MiB)" if size > LINE_SAMPLE_BYTES else "")}
    return {"size": None, "reason": f"{path} is a plain file: its {unit} cannot be counted without "
                                    f"reading it; declare prior.expected or measure a manifest"}


def measure_all(requests: list[dict], cwd: str = ".") -> list[dict]:
    """measure() for each {path, unit, count}; one bad request is its own reason, not an error."""
    out = []
    for r in requests:
        try:
            out.append(measure(str(r["path"]), str(r["unit"]), r.get("count"), cwd))
        except (OSError, KeyError, ValueError) as e:
            out.append({"size": None, "reason": f"{r.get('path')}: cannot be measured ({e})"})
    return out


def _manifest(d: Path) -> dict | None:
    try:
        m = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def _lines(p: Path, size: int) -> int:
    """Newlines of p (a last line without one counts), extrapolated past LINE_SAMPLE_BYTES."""
    n = read = 0
    last = b"\n"
    with open(p, "rb") as f:
        while read < LINE_SAMPLE_BYTES and (block := f.read(1 << 20)):
            n += block.count(b"\n")
            read += len(block)
            last = block[-1:]
    if read < size and read:
        return round(n * size / read)
    return n + (last != b"\n")
