"""From the status object (eaglelab.lab_status.Status, collect()'s answer) to what the pages show. Pure:
the status and `now` in, plain dicts out; no I/O, no Flask.

The status is read once (`Status.from_json`, at the snapshot's page build): runs, stages and the
engine's estimates arrive typed, a garbled field as absent. A finish time is the ETA engine's
`Finish`, never one estimated here; clock, end and ETA words come from eaglelab.display, as the
terminal's do. The other blocks arrive typed too (eaglelab.host_status, eaglelab.pipeline_status,
eaglelab.run_details: hosts and GPUs, forecast, side jobs, outcome, configuration notice, preflight,
a Slurm job's place), so the views below only format; `guarded` keeps one odd record to one cell.
A view that takes "an object or its JSON" does so because tests and the run page pass JSON.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from eaglelab import display
from eaglelab.figures import engine_words
from eaglelab.figures import human_duration as fmt_duration
from eaglelab.fsutil import parse_iso
from eaglelab.host_status import HostStatus
from eaglelab.lab_status import RunStatus, StageStatus, Status
from eaglelab.logstate import Finish, LogState
from eaglelab.model import ACTIVE, FINAL, RunState, StageState, exit_text
from eaglelab.pipeline_status import Acceptance, ConfigEvent, EngineFigures, Forecast, Outcome

MAX_TIMELINE_ROWS = 60  # past this, the timeline keeps the stages still to happen and the failed ones


# -- small readers --------------------------------------------------------------------------------

def ts(v: str | None) -> float | None:
    """An ISO time (our JSON's format: the typed records keep them as strings) as a POSIX timestamp,
    or None when absent or garbled."""
    try:
        return parse_iso(v)
    except ValueError:
        return None


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def fmt_clock(t: float | None, now: float) -> str:
    """Local clock time; with the weekday when it is not within the next/last 20 hours."""
    return display.clock(t, now)


def read(status: Status | dict, now: float) -> Status:
    """The status object: as given, or read once from its JSON (the snapshot keeps the JSON, and
    tests pass it): the one place the page reads the document."""
    return status if isinstance(status, Status) else Status.from_json(status, now)


def config_view(status: Status | dict, now: float) -> dict:
    """The configuration notice: the error that stands (a banner), else the last reload (a note),
    each with its clock time and the files (relative to the conf dir)."""
    cfg = read(status, now).config
    if cfg is None:
        return {}
    base = cfg.conf_dir.rstrip("/") + "/"

    def shown(event: ConfigEvent | None) -> dict | None:
        if event is None:
            return None
        short = [f[len(base):] if base != "/" and f.startswith(base) else f for f in event.files]
        return {"at": time.strftime("%H:%M:%S", time.localtime(event.at)) if event.at is not None else "",
                "files": ", ".join(short) or "a file", "paths": list(event.files), "message": event.message}
    return {"error": shown(cfg.error), "reloaded": shown(cfg.reloaded)}


def guarded(build: Callable[[], dict], fallback: dict) -> dict:
    """build(), or fallback with the error named: one odd record never takes the page down."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001 - any surprise in one record is shown, not raised
        return {**fallback, "error": f"{type(e).__name__}: {e}"[:300]}


# -- ETAs ---------------------------------------------------------------------------------------

def eta_view(fin: Finish | None, now: float, basis: str = "") -> dict | None:
    """The engine's finish in the page's words (eaglelab.display), with its times for the timeline."""
    if fin is None:
        return None
    return {**display.eta_words(fin, now), "source": "eta", "basis": basis, "at": fin.at, "low": fin.low,
            "high": fin.high}


def run_finish(run: RunStatus | None, stage: StageStatus | None) -> Finish | None:
    """The ETA engine's finish for a running run (its own estimate, else its stage's); None when the
    engine gave none: the page then says so rather than guess."""
    for est in (run.eta if run else None, stage.eta if stage else None):
        if est is not None and est.finish is not None:
            return est.finish
    return None


# -- the overview grid --------------------------------------------------------------------------

def progress_view(log_state: LogState | Any) -> dict | None:
    ls = log_of(log_state)
    prog = ls.progress if ls else None
    if prog is None:
        return None
    n, total, rate, unit = prog.n, prog.total, prog.rate_s_per_it, prog.unit
    ratio = max(0.0, min(1.0, n / total)) if total else None
    return {"n": _int_or(n), "total": _int_or(total) if total is not None else None, "unit": unit,
            "ratio": ratio, "pct": None if ratio is None else round(100 * ratio, 1), "label": prog.label,
            "rate": (f"{rate:.3g} s/{unit}" if rate >= 1 else f"{1 / rate:.3g} {unit}/s") if rate else ""}


def _int_or(v: float) -> float | int:
    return int(v) if v == int(v) else v


def state_file_note(rs: RunStatus) -> str:
    """What to say when a run has no parsed state (web.log_state_status, set by the snapshot)."""
    if rs.run.log_state is not None:
        return ""
    return {"missing": "no state file yet", "unreadable": "state file unreadable (half-written?)",
            "not_json_object": "state file is not a JSON object"}.get(rs.log_state_status, "no parsed state")


def _stage_of(stage: StageStatus | dict, now: float) -> StageStatus:
    """The stage object, or read from its JSON (tests pass a stage's JSON to `cell`)."""
    got = stage if isinstance(stage, StageStatus) else StageStatus.from_json(stage, now)
    return got or StageStatus("None", "None", None)  # not a stage record: a cell of no known state


def _run_of(run: RunStatus | dict | None, now: float) -> RunStatus | None:
    """The run object, or read from its JSON (tests pass a run record to `cell` and `exit_view`)."""
    return run if isinstance(run, RunStatus) or run is None else RunStatus.from_json(run, now)


UNKNOWN = "unknown"  # a stage whose record names no state the page knows


def cell(stage: StageStatus | dict, run: RunStatus | dict | None, hosts: dict[str, HostStatus], now: float) -> dict:
    """One host × stage cell of the overview."""
    st, rs = _stage_of(stage, now), _run_of(run, now)
    r = rs.run if rs else None
    log = rs.log if rs else None
    state = st.state or UNKNOWN
    host = hosts.get(st.host)
    failure = log.failure if log else None
    service = serving_view(st, rs, now) if state in (StageState.RUNNING, StageState.STALLED) else None
    # (stalled: a ready server whose log went quiet is up, not stalled)
    ended = state in FINAL
    fin = run_finish(rs, st) if state in (StageState.RUNNING, StageState.UNREACHABLE) and not service else None
    basis = (st.eta.basis or "") if st.eta and fin is not None else ""
    eta = eta_view(fin, now, basis)
    stuck = rs is not None and rs.eta is not None and rs.eta.stalled  # a bar quiet past its estimate's slow end
    if (state == StageState.STALLED or stuck) and not service:
        eta = {"unknown": "stalled: " + (str(rs.eta.reason) if stuck and state != StageState.STALLED
                                         else "no progress") + ", so no finish time"}  # not 0, not the last estimate
    started = display.clock(ts(r.started_at), now) if r else ""
    ended_at = display.clock(ts(r.ended_at), now) if r else ""
    return {
        "stage": st.name, "host": st.host, "state": str(state),
        "run_id": r.id if r else None,
        # an ended run shows its end, not the phase it was last in ("completed ▸ generating")
        "phase": log.phase if log and not ended and not service else None,
        "end": (f"{state} at {ended_at}" if ended_at else str(state)) if ended else "",
        "progress": progress_view(log) if state != StageState.COMPLETED and not service else None,
        "service": service,
        "eta": eta,
        "detail": exit_text(r) if r else "",
        "failure": {"reason": str(failure.get("reason") or "other"), "message": str(failure.get("message") or "")}
        if failure else None,
        "duration": fmt_duration(r.duration_s) if r else "",
        "started": started, "ended": ended_at,
        "unreachable_since": fmt_clock(ts(host.unreachable_since) if host else None, now)
        if state == StageState.UNREACHABLE else "",
        "note": state_file_note(rs) if rs and state in (StageState.RUNNING, StageState.STALLED) else "",
        "stall": log.stall_message if log and state == StageState.STALLED else "",
        "queue": queue_view(rs, now) if rs else None,
    }


def queue_view(rs: RunStatus, now: float) -> dict | None:
    """A Slurm run's place: job id, Slurm's state and reason, queue position, time queued, Slurm's
    own start estimate, the nodes (None for a run of another kind of host)."""
    sl = rs.slurm
    if sl is None:
        return None
    return {"job_id": sl.job_id or "?", "state": sl.state or "?",
            "reason": sl.reason if sl.reason not in (None, "None", "") else "",
            "position": sl.queue_position, "queued": fmt_duration(sl.queued_s),
            "start_estimate": fmt_clock(ts(sl.start_estimate), now) if rs.run.state == RunState.PENDING else "",
            "nodes": sl.nodelist or ""}


def overview(status: Status | dict, now: float) -> dict:
    """Hosts × stages: one row per host, its stages as cells in pipeline order."""
    st = read(status, now)
    hosts = {h.name: h for h in st.hosts}
    rows: dict[str, list] = {name: [] for name in hosts}
    for s in st.stages:
        c = guarded(lambda s=s: cell(s, st.run(s.latest_run), hosts, now),
                    {"stage": s.name, "host": s.host, "state": UNKNOWN, "run_id": s.latest_run})
        rows.setdefault(s.host, []).append(c)
    counts: dict[str, int] = {}
    for cells in rows.values():
        for c in cells:
            counts[c["state"]] = counts.get(c["state"], 0) + 1
    fin = st.pipeline.finish if st.pipeline else None
    # a finish time in the past is no ETA: the outcome says when it finished
    pipeline = eta_view(fin, now) if fin is not None and fin.at > now else None
    busy = any(c["state"] in (StageState.RUNNING, StageState.STALLED, StageState.UNREACHABLE) and not c.get("service")
               for cells in rows.values() for c in cells)
    return {"rows": [{"host": hosts.get(name, {"name": name}), "cells": cells} for name, cells in rows.items()],
            "counts": counts, "pipeline": pipeline if busy else None, "busy": busy,
            "outcome": guarded(lambda: outcome_view(st.outcome, now), {"verdict": "NOT MEASURED"})
            if st.outcome is not None else None,
            "forecast": guarded(lambda: forecast_view(st, now), {}),
            "side_jobs": guarded(lambda: side_jobs_view(st), [])}


def side_jobs_view(status: Status) -> list[dict]:
    """pipeline.side_jobs for the overview: a smoke that failed under this config is the next stage's
    failure (a banner); the others are one line each."""
    return [{"stage": sj.stage or "", "beside": sj.beside or "", "smoke_of": sj.smoke_of or "", "state": sj.state or "",
             "run": sj.run, "reason": sj.reason or "",
             "will_fail": bool(sj.smoke_of and sj.reason and sj.current_config), "engine": engine_view(sj.engine)}
            for sj in status.side_jobs if sj.run]


def engine_view(eng: EngineFigures | None) -> dict | None:
    """The engine check's figures (docs/foresight.md, "The engine check"): an alarm is a banner naming both."""
    return None if eng is None else {"alarm": eng.alarm, "words": engine_words(eng.to_json())}


SOURCE_WORDS = {"pilot": "a pilot slice's checkpoint", "checkpoint": "the latest training checkpoint (offline)",
                "eval": "the served measurement"}


def served_words(sv: Acceptance | None) -> dict:
    """The serving smoke's figures (a checkpoint served by vLLM while training ran), or {}."""
    if sv is None or sv.acceptance_rate is None:
        return {}
    return {"acceptance_rate": pct(sv.acceptance_rate), "mean_acceptance_length": fixed(sv.mean_acceptance_length),
            "epoch": sv.epoch or "", "run": sv.run or ""}


def sampled_words(sd: Acceptance | None, offline: Acceptance | None) -> str:
    """The sampled figure (an offline forecast's, or the eval's served sampled cell), with the offline
    sampled forecast beside a served one; '' without."""
    if sd is None or sd.acceptance_rate is None:
        return ""
    mal = sd.mean_acceptance_length
    out = pct(sd.acceptance_rate) + ("" if mal is None else f", mean length {mal:.2f}")
    if sd.on_policy is False:  # an offline figure on rows the eval would not have drawn
        out += OFF_POLICY
    if sd.engine_fault:  # a served figure from a server the output probe caught sampling wrongly
        out += BROKEN_SAMPLING
    if offline is not None and offline.acceptance_rate is not None:
        out += f" (offline forecast {pct(offline.acceptance_rate)}{OFF_POLICY if offline.on_policy is False else ''})"
    return out


OFF_POLICY = ", on rows not drawn as the eval samples"
BROKEN_SAMPLING = ", served by a broken sampling path (ENGINE OUTPUT FAULT: the engine's figure, not the drafter's)"


def fixed(v: float | None, unit: str = "") -> str:
    """A figure with two decimals ("1.87", "1.20×"), "" for none."""
    return "" if v is None else f"{v:.2f}{unit}"


def points(v: float | None) -> str:
    """A forecast's error in percentage points ("+1.5 pts"), "" for none."""
    return "" if v is None else f"{100 * v:+.1f} pts"


def forecast_view(status: Status, now: float) -> dict:
    """pipeline.forecast in words: verdict, figures, where from and how old; past forecasts' errors."""
    fc, hist = status.forecast, status.forecast_history
    if (fc is None or fc.acceptance_rate is None) and not hist:
        return {}
    fc = fc or Forecast()
    off = fc.offline
    return {
        "present": fc.acceptance_rate is not None,
        "verdict": fc.verdict or "", "css": (fc.verdict or "").lower().replace("_", "-"),
        "acceptance_rate": pct(fc.acceptance_rate), "mean_acceptance_length": fixed(fc.mean_acceptance_length),
        "speedup": fixed(fc.speedup, "×"),
        "source": fc.source or "", "source_words": SOURCE_WORDS.get(str(fc.source), ""),
        "checkpoints": fc.checkpoints, "run": fc.run,
        "age": fmt_duration(max(0.0, now - fc.made_at)) if fc.made_at is not None else "",
        "made": fmt_clock(fc.made_at, now),
        "offline": pct(off.acceptance_rate) if off else "",
        "sampled": sampled_words(fc.sampled, off.sampled if off else None),
        "decoding": fc.decoding or "greedy",  # the verdict's decoding (eval_decide_sampling)
        "greedy": sampled_words(fc.greedy, off.greedy if off else None) if fc.decoding == "sampled" else "",
        "served": served_words(fc.served_checkpoint),
        "reasons": list(fc.reasons),
        # the headline is the decoding the eval decided on; the other decoding's triple beside
        "history": [{"train_run": h.train_run, "forecast": pct(h.forecast_rate), "eval": pct(h.eval_rate),
                     "error": points(h.error), "source": h.source or "", "decoding": h.decoding or "greedy",
                     "other": h.other, "other_forecast": pct(h.by_decoding[h.other][0]),
                     "other_eval": pct(h.by_decoding[h.other][1]), "other_error": points(h.by_decoding[h.other][2])}
                    for h in hist],
    }


# -- the outcome (status_web/outcome.py) ----------------------------------------------------------

def pct(v: float | None, digits: int = 1) -> str:
    return "" if v is None else f"{100 * v:.{digits}f}%"


def outcome_view(out: Outcome, now: float) -> dict:
    """The banner's words and figures, and the history table's rows."""
    verdict = out.verdict or "NOT MEASURED"
    spec, base = out.spec_tokens_per_s, out.baseline_tokens_per_s
    return {
        "verdict": verdict, "css": verdict.lower().replace(" ", "-"),
        "reasons": list(out.reasons), "measured": out.measured, "eval_run": out.eval_run,
        "acceptance_rate": pct(out.acceptance_rate), "mean_acceptance_length": fixed(out.mean_acceptance_length),
        "per_position": [{"i": i + 1, "pct": pct(p, 0), "ratio": max(0.0, min(1.0, p))}
                         for i, p in enumerate(out.per_position)],
        "speedup": fixed(out.speedup, "×"),
        "tokens": f"{spec:.1f} tok/s with the drafter vs {base:.1f} without" if spec is not None and base is not None
        else "",
        "coverage": pct(out.coverage),
        "decided_at": f"concurrency {out.decided_at[0]}, {out.decided_at[1]}" if out.decided_at else "",
        "sweep": [{"sampling": r.sampling or "", "concurrency": r.concurrency, "speedup": fixed(r.speedup, "×"),
                   "spread": "" if r.speedup_min is None or r.speedup_max is None
                   else f"{r.speedup_min:.2f}–{r.speedup_max:.2f}",
                   "tokens": f"{r.spec_tokens_per_s or 0:.1f} vs {r.baseline_tokens_per_s or 0:.1f}",
                   "acceptance_rate": pct(r.acceptance_rate), "same": r.same or "—", "verdict": r.verdict or ""}
                  for r in out.sweep],
        "finished": fmt_clock(out.finished_at, now),
        "took": fmt_duration(out.took_s) if out.finished_at is not None else "",
        "history": [{"run_id": h.run_id, "ended": fmt_clock(ts(h.ended_at), now), "verdict": h.verdict or "",
                     "acceptance_rate": pct(h.acceptance_rate), "mean_acceptance_length": fixed(h.mean_acceptance_length),
                     "speedup": fixed(h.speedup, "×")} for h in out.history],
    }


def serving_view(stage: StageStatus, run: RunStatus | None, now: float) -> dict | None:
    """A ready service: since when it serves and how busy it is (vLLM's periodic stats), instead of
    its long-finished weight-loading bar and ETA."""
    ls = run.log if run else None
    if stage.kind != "service" or ls is None or not ls.ready:
        return None
    start = ts(run.run.started_at)
    for p in ls.phases:  # ready after the phases before `serving`
        if p.name == "serving":
            break
        if start is not None and p.duration_s is not None:
            start += p.duration_s
    gen, reqs, prompt = (ls.last(f"vllm/{k}") for k in ("gen_tokens_per_s", "running_reqs", "prompt_tokens_per_s"))
    load = [f"{gen:.1f} tokens/s generated" if gen is not None else "",
            f"{prompt:.1f} prompt tokens/s" if prompt is not None else "",
            f"{reqs:.0f} requests running" if reqs is not None else ""]
    return {"since": fmt_clock(start, now), "for": fmt_duration(now - start) if start is not None else "",
            "load": " · ".join(x for x in load if x) or "no request stats logged yet"}


# -- the pipeline timeline ------------------------------------------------------------------------

def timeline(status: Status | dict, now: float) -> dict:
    """Rows of segments: finished runs as they ran, the running one so far and its predicted rest,
    then the stages still to come, each after the ones it depends on. Predictions are the ETA
    engine's; a stage it has no estimate for says why instead of being drawn."""
    st = read(status, now)
    ends: dict[str, float] = {}  # predicted or real end of each stage, for its dependants
    rows = []
    for s in st.stages:
        row = guarded(lambda s=s: _timeline_row(s, st.run(s.latest_run), ends, now),
                      {"stage": s.name, "segments": [], "note": "unreadable"})
        rows.append(row)
    hidden = 0
    if len(rows) > MAX_TIMELINE_ROWS:  # a big lab: what is still to happen, and what went wrong
        critical = set(st.pipeline.critical_path if st.pipeline else ())
        keep = [r for r in rows if r["stage"] in critical
                or r.get("state") not in (RunState.COMPLETED, RunState.PENDING)
                or any(seg["kind"] == "predicted" for seg in r["segments"])][:MAX_TIMELINE_ROWS]
        hidden, rows = len(rows) - len(keep), keep
    starts = [seg["start"] for r in rows for seg in r["segments"]]
    stops = [seg.get("high") or seg["end"] for r in rows for seg in r["segments"]]
    fin = st.pipeline.finish if st.pipeline else None
    t0 = min(starts + [now])
    t1 = max(stops + [now] + ([fin.high or fin.at] if fin else []))
    pad = max((t1 - t0) * 0.03, 30.0)
    unknown = [r["stage"] for r in rows if not r["segments"] and r.get("state") == RunState.PENDING][:10]
    queued = any(seg["kind"] == "queued" for r in rows for seg in r["segments"])
    return {"rows": rows, "start": t0 - pad, "end": t1 + pad, "now": now, "hidden": hidden, "queued": queued,
            "finish": fin, "finish_view": eta_view(fin, now), "unestimated": unknown,
            "sources": estimate_sources(st), "never_ran": not st.runs}


def _predicted(name: str, begin: float, fin: Finish, tip: str) -> dict:
    return {"kind": "predicted", "start": begin, "end": fin.at, "low": fin.low, "high": fin.high, "tip": f"{name}: {tip}"}


def _timeline_row(stage: StageStatus, rs: RunStatus | None, ends: dict, now: float) -> dict:
    name = stage.name
    run = rs.run if rs else None
    # the run's own state draws the bar: a stage shown `unreachable` may hold a run that ended
    state = run.state if run else (stage.state or StageState.PENDING)
    if state == RunState.RUNNING and stage.state in (StageState.STALLED, StageState.UNREACHABLE):
        state = stage.state
    segs = []
    note = ""
    start = ts(run.started_at) if run else None
    submitted = ts(rs.slurm.submitted_at) if rs and rs.slurm else None
    queue_end = start if start is not None else (now if state == RunState.PENDING else None)
    if submitted is not None and queue_end is not None and queue_end > submitted:
        # queue time is its own segment: Slurm's wait is not the stage's work
        segs.append({"kind": "queued", "start": submitted, "end": queue_end,
                     "tip": f"{name}: queued {fmt_duration(queue_end - submitted)}"})
    deps_end = max([ends[d] for d in stage.depends_on if d in ends] + [now])
    again = stage.eta
    fin = again.finish if again else None
    if run and start is not None and state in FINAL:
        end = ts(run.ended_at) or start + (run.duration_s or 0)
        segs.append({"kind": str(state), "start": start, "end": end,
                     "tip": f"{name}: {state}, {fmt_duration(end - start)}"})
        ends[name] = end if state == RunState.COMPLETED else now
        if again and again.assumes_rerun and fin and fin.at > now:  # upstream reruns: so will this
            begin = again.start_at or deps_end
            segs.append(_predicted(name, begin, fin, f"rerun predicted {fmt_clock(begin, now)}–{fmt_clock(fin.at, now)}"))
            ends[name] = fin.at
    elif run and start is not None and state in (RunState.RUNNING, StageState.STALLED, StageState.UNREACHABLE):
        segs.append({"kind": str(state), "start": start, "end": now,
                     "tip": f"{name}: {state} for {fmt_duration(now - start)}"})
        fin = run_finish(rs, stage)
        if fin and fin.at > now:
            segs.append({**_predicted(name, now, fin, f"predicted to finish at {fmt_clock(fin.at, now)}{_basis(stage)}")})
        ends[name] = fin.at if fin else now
    elif fin is not None:
        begin = again.start_at or deps_end
        segs.append(_predicted(name, begin, fin, f"predicted {fmt_clock(begin, now)}–{fmt_clock(fin.at, now)}"
                                                 f"{_basis(stage)}"))
        ends[name] = fin.at
    else:
        note = (again.reason if again else None) or "no estimate yet (never completed)"
        ends[name] = deps_end
    return {"stage": name, "state": str(state), "segments": segs, "note": note}


def _basis(stage: StageStatus) -> str:
    """What a stage's estimate rests on, for a tooltip: "prior: 64 samples at ...", "learned from
    2 runs: ...", "live" (the ETA engine's words)."""
    basis = stage.eta.basis if stage.eta else None
    return f" ({basis})" if basis and basis != "done" else ""


def estimate_sources(status: Status) -> str:
    """How the stages still to finish are estimated, counted: "live 1 · learned 2 · prior 5"."""
    names = {"progress": "live", "mixed": "live", "prior": "prior", "learned": "learned",
             "history": "history", "other_host": "other hosts", "size": "size", "unknown": "none"}
    counts: dict[str, int] = {}
    for s in status.stages:
        src = s.eta.source if s.eta else None
        if src and src != "done":
            key = names.get(src, src)
            counts[key] = counts.get(key, 0) + 1
    order = ["live", "learned", "history", "prior", "size", "other hosts", "none"]
    return " · ".join(f"{k} {counts[k]}" for k in sorted(counts, key=lambda k: order.index(k) if k in order else 99))


# -- rate plots -----------------------------------------------------------------------------------

def log_of(log_state: LogState | Any) -> LogState | None:
    """The log state object: as given, or read once from its JSON (tests pass the state JSON)."""
    return log_state if isinstance(log_state, LogState) else LogState.from_json(log_state)


def bar_history(log_state: LogState | Any) -> list[tuple[float, float]]:
    """The current bar's (elapsed_s, n) samples from the state JSON (progress.history), in order."""
    ls = log_of(log_state)
    return list(ls.progress.history) if ls and ls.progress else []


def seconds_per_item(samples: list[tuple[float, float]], resolution_s: float = 1.0,
                     max_points: int = 120) -> list[tuple[float, float]]:
    """(item index, seconds per item) over the run: consecutive samples joined until they span at
    least one item and enough time that tqdm's whole-second clock errs by ~10% at most (10
    resolutions), less when the bar is still short (8 points at least), more when there are many."""
    if len(samples) < 2:
        return []
    span = samples[-1][0] - samples[0][0]
    min_dt = max(resolution_s, min(10 * resolution_s, span / 8), span / max_points)
    out = []
    a = samples[0]
    for b in samples[1:]:
        dn, dt = b[1] - a[1], b[0] - a[0]
        if dn < 0 or dt < 0:  # the bar restarted: start again from here
            a = b
            continue
        if dn >= 1 and dt >= min_dt:
            out.append(((a[1] + b[1]) / 2, dt / dn))
            a = b
    return out


def rate_plots(status: Status | dict, now: float = 0.0) -> list[dict]:
    """One plot per running run whose current bar has a history: time per item over the run."""
    plots = []
    for rs in read(status, now).runs:
        r, prog = rs.run, rs.progress
        if r.state != RunState.RUNNING:
            continue
        pts = seconds_per_item(list(prog.history)) if prog else []
        unit = prog.unit if prog else "it"
        title = " · ".join(x for x in (r.stage, (rs.log.phase if rs.log else None) or (prog.label if prog else ""))
                           if x)
        plots.append({"run_id": r.id, "stage": r.stage, "host": r.host, "title": title,
                      "points": pts, "unit": unit, "x_label": f"{unit} (item index)",
                      "y_label": f"s/{unit}"})
    return plots


# -- run page -------------------------------------------------------------------------------------

_POSITION = re.compile(r"acc_(\d+)")


def metric_rank(name: str) -> tuple:
    """Loss first, then per-position accuracy by position (they predict acceptance), then the rest
    alphabetically (learning rates, throughput)."""
    short = name.rsplit("/", 1)[-1]
    pos = _POSITION.search(short)
    if name.startswith("acceptance/"):  # the offline acceptance curve (eaglelab.stages.acceptance) leads
        return (-1, name != "acceptance/rate", name)
    if "loss" in short:
        return (0, name.startswith("val"), name)
    if pos:
        return (1, name.startswith("val"), int(pos.group(1)), name)
    if "acc" in short:
        return (2, name)
    return (3, name)


def split_metrics(series: list[dict]) -> tuple[list[dict], list[dict]]:
    """(plots, constants): a series with one point or one value is a table row, not a plot."""
    ordered = sorted(series, key=lambda m: metric_rank(m["name"]))
    plots = [m for m in ordered if len({v for _, v in m["points"]}) > 1]
    return plots, [m for m in ordered if m not in plots]


def metric_series(log_state: LogState | Any) -> list[dict]:
    """Each metric as (step, value) points (LogState.metrics: malformed entries dropped, not fatal)."""
    ls = log_of(log_state)
    return [{"name": name, "points": list(pts), "last": pts[-1][1], "count": len(pts)}
            for name, pts in sorted((ls.metrics if ls else {}).items())]


def phases_view(log_state: LogState | Any) -> list[dict]:
    ls = log_of(log_state)
    return [{"name": p.name, "duration": fmt_duration(p.duration_s), "started_line": p.started_line,
             "ended_line": p.ended_line} for p in (ls.phases if ls else ())]


def preflight_view(rs: RunStatus) -> list[dict]:
    """Preflight results (eaglelab.control.pipeline.preflight.as_dicts: name, ok, detail, fix), when the run record or
    its state carries them."""
    return [{"check": c.check, "ok": c.ok, "verdict": c.verdict, "message": c.message, "fix": c.fix}
            for c in rs.preflight]


def run_view(rs: RunStatus, now: float) -> dict:
    """A run's page, less its log tail and the charts' drawing: phases, metrics (plots and constants),
    preflight, how it stands or ended, its cell, times."""
    r = rs.run
    plots, constants = split_metrics(metric_series(rs.log))
    return {"phases": phases_view(rs.log), "plots": plots, "constants": constants,
            "preflight": preflight_view(rs), "exit": exit_view(rs),
            "cell": cell(StageStatus(r.stage, r.host, StageState(r.state)), rs, {}, now),
            "started": fmt_clock(ts(r.started_at), now), "ended": fmt_clock(ts(r.ended_at), now),
            "duration": fmt_duration(r.duration_s), "note": state_file_note(rs)}


def exit_view(run: RunStatus | dict) -> str:
    """How a run stands or ended, in words ("killed: signal 15 (stop requested)")."""
    r = _run_of(run, 0.0).run
    if r.state in ACTIVE:
        return f"{r.state} (pid {r.pid})" if r.pid else str(r.state)
    return f"{r.state}: {exit_text(r) or 'exit code 0'}" + (" (stop requested)" if r.stop_requested else "")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b.")


def log_tail(data: bytes, lines: int = 60) -> list[str]:
    """The last lines of a log as a terminal would show them: `\\r` frames keep their last state,
    ANSI colour codes are dropped, invalid UTF-8 replaced. (Escaping is the template's job.)"""
    text = data.decode("utf-8", "replace").replace("\r\n", "\n")
    shown = [_ANSI.sub("", ln.rstrip("\r").rsplit("\r", 1)[-1]) for ln in text.split("\n")]
    if shown and shown[-1] == "":
        shown.pop()
    return [ln[:2000] for ln in shown[-lines:]]


def gpus_view(host: HostStatus) -> list[dict]:
    """Each GPU: utilisation, memory, and the runs holding it (hostside.mark_gpu_holders)."""
    out = []
    for g in host.gpus or ():
        used, total, util = g.memory_used_mib, g.memory_total_mib, g.utilization_pct
        out.append({"index": g.index, "name": g.name,
                    "util": util, "util_ratio": None if util is None else max(0.0, min(1.0, util / 100)),
                    "mem": f"{used / 1024:.1f} / {total / 1024:.1f} GiB" if used is not None and total
                    else "", "mem_ratio": (used / total) if used is not None and total else None,
                    "runs": list(g.runs or ()), "others": g.other_processes, "holders_known": g.runs is not None})
    return out


def load_view(load: tuple[float, ...] | None) -> str:
    """The 1/5/15-minute load averages, or "" when the host did not say."""
    return " · ".join(f"{v:.2f}" for v in load) if load else ""


def host_view(host: HostStatus, status: Status, now: float) -> dict:
    """A host of the hosts page: how it is reached and stands, its GPUs, load, disk and runs."""
    return {"name": host.name, "reach": host.reach, "reachable": host.reachable, "error": host.error,
            "gpus": host.gpus, "gpus_configured": host.gpus_configured, "gpu_rows": gpus_view(host),
            "since": fmt_clock(ts(host.unreachable_since), now), "checked": fmt_clock(ts(host.checked_at), now),
            "disk": fmt_bytes(host.free_disk_bytes), "load_text": load_view(host.load),
            "running": running_on(status, host.name)}


def running_on(status: Status, host: Any) -> list[dict]:
    return [{"id": r.run.id, "stage": r.run.stage, "kind": r.run.kind} for r in status.runs
            if r.run.host == host and r.run.state in ACTIVE]
