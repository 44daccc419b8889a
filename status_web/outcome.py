"""How the pipeline went, for the top of the overview: the verdict (FASTER / SLOWER / NOT MEASURED),
acceptance rate, mean acceptance length, per-position acceptance, speedup and vocab coverage, read
from the lines our own eval and vocab stages print (py/eaglelab/stages/eval.py, vocab.py), plus the
same figures for every earlier eval run: the history across pipeline runs.

Logs are read through the host's executor, so remote hosts work too; a finished run's log never
changes, so each is read once per server (`OutcomeReader` keeps what it parsed by run id).
"""

from __future__ import annotations

import re
from typing import Any

from eaglelab.fsutil import parse_iso
from eaglelab.lab_status import Status
from eaglelab.logstate import LogState
from eaglelab.model import FINAL, Run, RunState, StageState

LOG_BYTES = 256 * 1024  # the summary lines are at the end of short logs
HISTORY = 20

_SUMMARY = re.compile(r"eval summary: acceptance_rate=(?P<rate>[\d.eE+-]+) mean_acceptance_length=(?P<len>[\d.eE+-]+)"
                      r" speedup=(?P<speedup>[\d.eE+-]+|nan|inf) verdict=(?P<verdict>\w+)")
_POSITIONS = re.compile(r"per position \[(?P<pos>[^\]]*)\] \((?P<drafts>\d+) drafts\)")
_TOKENS = re.compile(r"eval: (?P<spec>[\d.]+) tokens/s with the drafter vs (?P<base>[\d.]+) without")
_VERDICT = re.compile(r"(?:!!! VERDICT: |eval: VERDICT )(?P<verdict>\w+): (?P<reasons>.*)$")
_DECIDED = re.compile(r"verdict=\w+ concurrency=(?P<conc>\d+) sampling=(?P<sampling>\w+)")
# one row of the eval's sweep table (stages/eval.py table())
_SWEEP_ROW = re.compile(r"^(?P<sampling>greedy|sampled)\s+(?P<conc>\d+)\s+(?P<base>[\d.]+) \[[^\]]*\]\s+"
                        r"(?P<spec>[\d.]+) \[[^\]]*\]\s+(?P<speedup>[\d.]+)x \[(?P<lo>[\d.]+)-(?P<hi>[\d.]+)\]\s+"
                        r"\S+\s+\S+\s+(?P<acc>[\d.]+)%\s+(?P<mal>[\d.]+)\s+\S*\s+(?P<same>\S+)\s+(?P<verdict>\w+)\s*$",
                        re.M)
_COVERAGE = re.compile(r"vocab coverage: (?P<pct>[\d.]+)% of (?P<tokens>\d+) supervised tokens")
# what the eval stage's verdict words mean to a reader of the page
HEADLINE = {"PAYS": "FASTER", "NEUTRAL": "NO FASTER", "SLOWER": "SLOWER", "LOW_ACCEPTANCE": "LOW ACCEPTANCE"}


def parse_eval(text: str) -> dict | None:
    """The eval stage's figures from its log text, or None when it printed no summary."""
    m = _last(_SUMMARY, text)
    if m is None:
        return None
    out: dict[str, Any] = {"acceptance_rate": float(m["rate"]), "mean_acceptance_length": float(m["len"]),
                           "speedup": _float(m["speedup"]), "verdict": m["verdict"], "reasons": [],
                           "per_position": [], "drafts": None, "spec_tokens_per_s": None,
                           "baseline_tokens_per_s": None}
    if p := _last(_POSITIONS, text):
        out["per_position"] = [v for v in (_float(x) for x in p["pos"].split(",")) if v is not None]
        out["drafts"] = int(p["drafts"])
    if t := _last(_TOKENS, text):
        out["spec_tokens_per_s"], out["baseline_tokens_per_s"] = float(t["spec"]), float(t["base"])
    for line in text.splitlines():
        if v := _VERDICT.search(line):
            out["reasons"] = [r.strip() for r in v["reasons"].split(";") if r.strip()]
    d = _DECIDED.search(text, m.start(), m.end() + 80)
    out["decided_at"] = {"concurrency": int(d["conc"]), "sampling": d["sampling"]} if d else None
    table = text[text.rfind("eval sweep ("):m.start()] if "eval sweep (" in text[:m.start()] else ""
    out["sweep"] = [{"sampling": r["sampling"], "concurrency": int(r["conc"]), "baseline_tokens_per_s": float(r["base"]),
                     "spec_tokens_per_s": float(r["spec"]), "speedup": float(r["speedup"]),
                     "speedup_min": float(r["lo"]), "speedup_max": float(r["hi"]),
                     "acceptance_rate": float(r["acc"]) / 100, "mean_acceptance_length": float(r["mal"]),
                     "same": None if r["same"] == "-" else r["same"], "verdict": r["verdict"]}
                    for r in _SWEEP_ROW.finditer(table)]
    return out


def parse_coverage(text: str) -> float | None:
    c = _last(_COVERAGE, text)
    return float(c["pct"]) / 100 if c else None


def _last(rx: re.Pattern, text: str):
    m = None
    for m in rx.finditer(text):  # noqa: B007 - the loop keeps the last match in m
        pass
    return m


def _float(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


class OutcomeReader:
    """status -> status["outcome"], reading each finished eval / vocab run's log once."""

    def __init__(self, lab):
        self.lab = lab
        self.parsed: dict[str, dict | None] = {}  # run id -> figures (None: the log had none)

    def stage_kinds(self) -> dict[str, str]:
        """Stage name -> "eval" | "vocab" for the stages that run our eval (not its baseline) or vocab."""
        kinds = {}
        for name, st in self.lab.cfg.stages.items():
            cmd = " ".join(st.command)
            if "eaglelab.stages.eval" in cmd and "baseline" not in cmd:
                kinds[name] = "eval"
            elif "eaglelab.stages.vocab" in cmd:
                kinds[name] = "vocab"
        return kinds

    def figures(self, run: Run, kind: str, unreachable: set[str]) -> dict | None:
        rid = run.id
        if rid in self.parsed:
            return self.parsed[rid]
        if run.host in unreachable:
            return None  # asked again when the host is back
        try:
            data = self.lab.executor(run.host).read_log(rid, 0, 16 * LOG_BYTES)[-LOG_BYTES:]
        except Exception:  # noqa: BLE001 - a log we cannot read is asked for again next refresh
            return None
        text = data.decode("utf-8", "replace")
        figs = parse_eval(text) if kind == "eval" else (
            {"coverage": c} if (c := parse_coverage(text)) is not None else None)
        if run.state in FINAL:
            self.parsed[rid] = figs
        return figs

    def __call__(self, status: dict) -> dict:
        status["outcome"] = outcome(status, self.stage_kinds(), self.figures)
        return status


def outcome(status: Status | dict, kinds: dict[str, str], figures) -> dict:
    """The verdict and figures of the latest eval run, coverage of the latest vocab run, and one
    history row per finished eval run (newest first). `figures(run, kind, unreachable)` reads a log."""
    st = _read(status)
    unreachable = {h.name for h in st.hosts if h.reachable is False}
    runs = [rs.run for rs in st.runs if rs.run.stage in kinds]
    evals = [r for r in runs if kinds[r.stage] == "eval" and r.state in FINAL]
    vocabs = [r for r in runs if kinds[r.stage] == "vocab" and r.state == RunState.COMPLETED]
    coverage = next(((f or {}).get("coverage") for r in reversed(vocabs)
                     if (f := figures(r, "vocab", unreachable)) is not None), None)
    history = []
    for r in reversed(evals[-HISTORY:]):
        figs = figures(r, "eval", unreachable)
        history.append({"run_id": r.id, "state": r.state.value, "ended_at": r.ended_at,
                        "verdict": headline((figs or {}).get("verdict")), **({k: figs.get(k) for k in (
                            "acceptance_rate", "mean_acceptance_length", "speedup")} if figs else {})})
    latest = evals[-1] if evals else None
    figs = figures(latest, "eval", unreachable) if latest else None
    if figs:
        return {**figs, "verdict": headline(figs["verdict"]), "eval_verdict": figs["verdict"], "coverage": coverage,
                "eval_run": latest.id, "measured": True, "history": history, **finished(st)}
    if latest is None:
        running = any(r.state in (RunState.RUNNING, RunState.PENDING) for r in runs if kinds[r.stage] == "eval")
        why = "eval is running" if running else ("no eval stage in this pipeline" if "eval" not in kinds.values()
                                                 else "eval has not run yet")
    else:
        why = f"the last eval run ({latest.id}) {latest.state} without a summary"
        log = LogState.from_json(latest.log_state)
        fail = (log.failure if log else None) or {}
        if fail.get("message"):
            why += f": {fail.get('reason')}: {fail['message']}"
    return {"verdict": "NOT MEASURED", "reasons": [why], "coverage": coverage, "measured": False,
            "eval_run": latest.id if latest else None, "history": history, **finished(st)}


def _read(status: Status | dict) -> Status:
    """The status object (the app's refresher hands over the JSON it is about to publish)."""
    return status if isinstance(status, Status) else Status.from_json(status, 0.0)


def headline(verdict: str | None) -> str:
    return HEADLINE.get(verdict or "", verdict or "NOT MEASURED")


def finished(status: Status | dict) -> dict:
    """When the pipeline's latest runs ended and how long they took, first start to last end; only
    once nothing of it is running or waiting."""
    st = _read(status)
    ends, starts = [], []
    for s in st.stages:
        if s.state in (RunState.RUNNING, StageState.STALLED, StageState.UNREACHABLE):
            if s.kind == "service":
                continue  # a service left up does not keep the pipeline from being done
            return {"finished_at": None, "took_s": None}
        rs = st.run(s.latest_run)
        if rs is None or s.kind == "service":
            continue
        a, b = _ts(rs.run.started_at), _ts(rs.run.ended_at)
        if a is not None:
            starts.append(a)
        if b is not None:
            ends.append(b)
    if not ends:
        return {"finished_at": None, "took_s": None}
    return {"finished_at": max(ends), "took_s": max(ends) - min(starts) if starts else None}


def _ts(v: str | None) -> float | None:
    try:
        return parse_iso(v)
    except ValueError:
        return None
