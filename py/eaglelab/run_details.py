"""What a run's page shows beyond its record, typed: its preflight results (`PreflightCheck`) and,
on a Slurm host, its place in the queue (`SlurmJob`). Read once by `from_json` from the run record
(eaglelab.lab_status.RunStatus asks): a field of the wrong type reads as absent, never raises.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .logstate import _number

VERDICTS = {True: "PASS", False: "FAIL", None: "WARN"}  # a check's `ok`: passed, failed, only a warning


@dataclass(frozen=True)
class PreflightCheck:
    """One preflight result (eaglelab.control.pipeline.preflight.as_dicts: name, ok, detail, fix)."""

    check: str
    ok: bool | None
    verdict: str  # PASS, FAIL, WARN; "?" for an `ok` that is none of true, false, null
    message: str = ""
    fix: str = ""

    @classmethod
    def from_json(cls, data: Any) -> PreflightCheck | None:
        if not isinstance(data, dict):
            return None
        ok = data.get("ok")
        known = isinstance(ok, bool) or ok is None
        return cls(str(data.get("check") or data.get("name") or "?"), ok if known else None,
                   VERDICTS[ok] if known else "?", str(data.get("message") or data.get("detail") or ""),
                   str(data.get("fix") or ""))

    @classmethod
    def all_from_json(cls, raw: Any) -> tuple[PreflightCheck, ...]:
        """The checks of a record's `preflight`, in any of its three forms (this one value is
        polymorphic by history): a list of results, {"checks": [...]}, or {name: ok or result}."""
        if isinstance(raw, dict):
            raw = raw.get("checks") or [{"check": k, **(v if isinstance(v, dict) else {"ok": bool(v)})}
                                        for k, v in raw.items()]
        return tuple(c for c in map(cls.from_json, raw if isinstance(raw, list) else []) if c is not None)


@dataclass(frozen=True)
class SlurmJob:
    """A Slurm run's place (host/slurmside): job id, Slurm's state and reason, queue position, time
    queued, Slurm's own start estimate, the nodes; times are the JSON's ISO strings."""

    job_id: str | None = None
    state: str | None = None
    reason: str | None = None
    queue_position: int | None = None
    queued_s: float | None = None
    submitted_at: str | None = None
    start_estimate: str | None = None
    nodelist: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> SlurmJob | None:
        """None for a run of another kind of host (no `slurm`, or an empty one)."""
        if not isinstance(data, dict) or not data:
            return None
        pos = data.get("queue_position")
        words = {k: None if data.get(k) is None else str(data.get(k))
                 for k in ("job_id", "state", "reason", "nodelist")}
        return cls(queue_position=pos if isinstance(pos, int) and not isinstance(pos, bool) else None,
                   queued_s=_number(data.get("queued_s")), submitted_at=_str(data.get("submitted_at")),
                   start_estimate=_str(data.get("start_estimate")), **words)


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None
