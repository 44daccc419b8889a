"""One preflight verdict, `Check`: what preflight (a workstation) and slurm_preflight (a Slurm host) return."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Check:
    name: str
    ok: bool | None  # None: could not be decided (a warning, not a failure)
    detail: str
    fix: str = ""

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "WARN"}[self.ok]

    def line(self) -> str:
        return f"{self.verdict:4} {self.name:6} {self.detail}" + (f" — fix: {self.fix}" if self.ok is False else "")
