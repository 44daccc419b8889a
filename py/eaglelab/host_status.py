"""A host as the status shows it (`HostStatus`): how it is reached, whether it answered, and the
machine's facts from its last report (hostside.report: `Gpu`s, free disk, load). Read once from the
status document's `hosts` by `from_json` — a field of the wrong type reads as absent, never raises —
so the page and the terminal format typed fields; `to_json` gives back the host's record as built.
Standard library only (eaglelab.lab_status reads it when a front end first asks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .logstate import _number


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


@dataclass(frozen=True)
class Gpu:
    """One GPU of a host's report: utilisation, memory, and the runs holding it
    (hostside.mark_gpu_holders; `runs` is None when the report did not say who holds it)."""

    index: Any = None  # nvidia-smi's index, shown as it came
    name: str = "GPU"
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    runs: tuple[str, ...] | None = None
    other_processes: int = 0

    @classmethod
    def from_json(cls, data: Any) -> Gpu | None:
        if not isinstance(data, dict):
            return None
        runs = data.get("runs")
        others = _number(data.get("other_processes"))
        return cls(data.get("index"), str(data.get("name") or "GPU"), _number(data.get("utilization_pct")),
                   _number(data.get("memory_used_mib")), _number(data.get("memory_total_mib")),
                   None if "runs" not in data else tuple(str(r) for r in runs) if isinstance(runs, list) else (),
                   int(others) if others else 0)


@dataclass(frozen=True)
class HostStatus:
    """One of the status's `hosts` (docs/interfaces.md): `reachable` is None when the host was never
    asked; `gpus` None when it reported none (no nvidia-smi); times are the JSON's ISO strings."""

    name: str
    reach: str | None = None
    reachable: bool | None = None
    unreachable_since: str | None = None
    checked_at: str | None = None
    error: str | None = None
    gpus: tuple[Gpu, ...] | None = None
    gpus_configured: int | None = None
    free_disk_bytes: float | None = None
    load: tuple[float, float, float] | None = None  # the 1/5/15-minute load averages
    bad_runs: tuple[dict, ...] = ()  # run directories the report skipped: {run_dir, error}
    json: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> HostStatus | None:
        """None when it is no host record (not an object)."""
        if not isinstance(data, dict):
            return None
        gpus, load, reachable = data.get("gpus"), data.get("load"), data.get("reachable")
        loads = [_number(v) for v in load] if isinstance(load, list) and len(load) == 3 else []
        configured = data.get("gpus_configured")
        bad = data.get("bad_runs")
        return cls(str(data.get("name")), _str(data.get("reach")), reachable if isinstance(reachable, bool) else None,
                   _str(data.get("unreachable_since")), _str(data.get("checked_at")),
                   None if data.get("error") is None else str(data.get("error")),
                   tuple(g for g in map(Gpu.from_json, gpus) if g is not None) if isinstance(gpus, list) else None,
                   configured if isinstance(configured, int) and not isinstance(configured, bool) else None,
                   _number(data.get("free_disk_bytes")),
                   tuple(loads) if loads and None not in loads else None,
                   tuple(b for b in bad if isinstance(b, dict)) if isinstance(bad, list) else (), data)

    def to_json(self) -> dict:
        return self.json
