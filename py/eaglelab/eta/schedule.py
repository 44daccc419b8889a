"""Stage and pipeline ETAs (`annotate`): the current bar (its estimate from the state JSON) and
the history of earlier runs of the same stage on the same host and profile, phase by phase, with
finish times propagated through the stages' `depends_on` DAG. Pure: the clock is passed in."""

from __future__ import annotations

import datetime as _dt
import statistics
from typing import Any

from eaglelab.figures import seconds
from eaglelab.model import RunState, StageState

from .history import HISTORY_WIDEN, ZERO, History, Span, phase_estimate, phase_template
from .prior import Prior, learned_span, stage_estimate

READY_PHASES = ("ready", "serving")  # a service is "done" for the DAG once its log says it is ready


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    t = _dt.datetime.fromtimestamp(ts, _dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _epoch(s: str | None) -> float | None:
    if not s:
        return None
    return _dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def _progress_span(progress: dict | None, now: float) -> Span | None:
    """The current bar's remaining time from the state JSON's progress (the tailer's estimate)."""
    if not progress:
        return None
    n, total = progress.get("n"), progress.get("total")
    if total is not None and n is not None and n >= total:
        return None  # the bar is done; the phase goes on without it
    eta = progress.get("eta_s")
    if eta is None:
        rate = progress.get("rate_s_per_it")
        if rate is None or total is None or n is None:
            return None
        eta = rate * (total - n)
    low, high = progress.get("eta_low_s"), progress.get("eta_high_s")
    if low is None or high is None:  # a bar estimated by tqdm only: tqdm's number, a wide range
        low, high = eta * 0.5, eta * 2.0
    # The observation may be older than now (the tailer throttles): count the time since.
    seen = _epoch(progress.get("observed_at"))
    since = max(now - seen, 0.0) if seen is not None else 0.0
    return Span(max(eta - since, 0.0), max(low - since, 0.0), max(high - since, eta - since, 0.0), "progress")


STUCK_MIN_S = 60.0  # a bar quiet for less than this is never called stuck (a slow item is not a stall)


def stalled_reason(log: dict, now: float) -> str | None:
    """Why a running run has no finish time to give, or None: its log says it is stalled, or its
    unfinished bar has not moved for longer than even the slow end of its own estimate (the bar's
    remaining time, counted down since its last frame, would read "finishing now, range [0, 0]"
    for as long as it stays stuck)."""
    if log.get("state") == StageState.STALLED:
        return (log.get("stall") or {}).get("message") or "the log says the run is stalled"
    progress = log.get("progress") or {}
    n, total, seen = progress.get("n"), progress.get("total"), _epoch(progress.get("observed_at"))
    if seen is None or n is None or total is None or n >= total:
        return None
    slow_end = progress.get("eta_high_s")
    if slow_end is None:
        slow_end = 2.0 * progress["eta_s"] if progress.get("eta_s") is not None else None
    quiet = now - seen
    if slow_end is None or quiet <= max(slow_end, STUCK_MIN_S):
        return None
    return (f"its bar has not moved for {quiet:.0f} s (at {n}/{total}), longer than the slow end of its "
            f"estimate ({slow_end:.0f} s)")


def run_eta(run: dict, history: History, profile: str, now: float) -> dict | None:
    """ETA of a running run: the current phase (its bar, else its history minus the time it has
    run) plus every later phase of the stage's template. None for runs that are not running.

    Where the log names no phase, the current one is the template's first unfinished phase (for a
    stage whose runs have no phases, WHOLE_RUN: the run itself)."""
    if run.get("state") != RunState.RUNNING:
        return None
    stage, host = run.get("stage", ""), run.get("host", "")
    log = run.get("log_state") or {}
    done = [p for p in log.get("phases") or [] if p.get("duration_s") is not None and p.get("name") != log.get("phase")]
    done_names = {p["name"] for p in done}
    template = phase_template(history, stage, host, profile)
    current = log.get("phase") or next((p for p in template if p not in done_names), None)
    started = _epoch(run.get("started_at"))
    run_elapsed = max(now - started, 0.0) if started is not None else None
    # Time outside every phase (interpreter start, imports, teardown) shows only in whole-run
    # durations: earlier runs' median of (duration - their phases), spent first.
    same = history.same(stage, host, profile)
    gaps = [max(r.duration_s - sum(p.duration_s for p in r.phases), 0.0) for r in same if r.phases]
    overhead = statistics.median(gaps) if gaps else 0.0
    log_phases = log.get("phases") or []
    first_t0 = _epoch(log_phases[0].get("started_at")) if log_phases else None
    if run_elapsed is None:
        overhead_left = 0.0
    elif not log_phases:
        overhead_left = max(overhead - run_elapsed, 0.0)  # nothing has started yet
    elif first_t0 is not None and started is not None:
        overhead_left = max(overhead - (first_t0 - started), 0.0)
    else:
        overhead_left = 0.0
    open_phase = next((p for p in log_phases if p.get("name") == current and p.get("duration_s") is None), {})
    phase_t0 = _epoch(open_phase.get("started_at"))  # the tailer stamps a phase's start (live)
    if phase_t0 is not None:
        in_phase = max(now - phase_t0, 0.0)
    elif not log_phases:
        in_phase = max((run_elapsed or 0.0) - overhead, 0.0)
    else:
        in_phase = max(run_elapsed - sum(p["duration_s"] for p in done), 0.0) if run_elapsed is not None else 0.0

    phases_out: list[dict] = [{"name": p["name"], "state": "done", "duration_s": p["duration_s"]} for p in done]
    stuck: str | None = None
    if current in READY_PHASES or (run.get("kind") == "service" and log.get("ready")):
        current_span: Span | None = ZERO  # a service that is up: done, as far as the pipeline waits
    elif (stuck := stalled_reason(log, now)) is not None:
        current_span = None  # no progress: any finish time (history's "a little more" too) would be made up
    else:
        current_span = _progress_span(log.get("progress"), now)
        hist = phase_estimate(history, stage, host, profile, current) if current and current_span is None else None
        if hist is not None:
            left = lambda d: max(d - in_phase, 0.0)
            # Already longer than any earlier run: a little more at least, and a range that says so.
            current_span = Span(left(hist.eta_s), left(hist.low_s), max(left(hist.high_s), hist.eta_s * 0.1),
                                hist.source)
    # no phase, no bar, no history: unknown (null), never "finishing now" (a silent stage used to
    # read 0 s, range [0, 0], for as long as it ran)
    if current:
        entry: dict[str, Any] = {"name": current, "state": "running"}
        if current_span is not None:
            entry.update(_span_fields(current_span, now))
        phases_out.append(entry)
    unknown = current_span is None
    total = current_span or ZERO

    # Later phases: the template's after the current one (those not seen, if it is not in the template).
    later = (template[template.index(current) + 1:] if current in template
             else [p for p in template if p not in done_names and p != current])
    for name in later:
        span = phase_estimate(history, stage, host, profile, name)
        entry = {"name": name, "state": "pending"}
        if span is None:
            unknown = True
        else:
            entry["expected_duration_s"] = seconds(span.eta_s)
            entry.update(_span_fields(span, now, start=total))
            total = total + span
        phases_out.append(entry)
    if overhead_left > 0 and not unknown:
        total = total + Span(overhead_left, overhead_left / (1 + HISTORY_WIDEN), overhead_left * (1 + HISTORY_WIDEN),
                             total.source)
    out: dict[str, Any] = {"phases": phases_out}
    if unknown:
        out.update({"eta_s": None, "eta_low_s": None, "eta_high_s": None, "finish_at": None,
                    "source": "unknown"})
        if stuck is not None:
            out.update(source="stalled", reason=stuck)
    else:
        out.update(_span_fields(total, now))
    return out


def _span_fields(span: Span, now: float, start: Span = ZERO) -> dict:
    return {"eta_s": seconds(start.eta_s + span.eta_s),
            "eta_low_s": seconds(start.low_s + span.low_s),
            "eta_high_s": seconds(start.high_s + span.high_s),
            "finish_at": _iso(now + start.eta_s + span.eta_s),
            "source": span.source}


BASIS = {"progress": "live", "done": "done", "history": "history of this stage here",
         "other_host": "this stage on another host or profile", "size": "size x a rate measured elsewhere",
         "mixed": "live, then history"}


def pipeline_finish(stages: list[dict], runs_by_id: dict[str, dict], run_etas: dict[str, dict],
                    history: History, profile: str, now: float,
                    priors: dict[str, dict] | None = None) -> tuple[dict[str, dict], dict]:
    """Finish times (eta / low / high, epoch seconds) of every stage through depends_on, and the
    pipeline's: a stage starts when the last of its dependencies finishes (or now). `priors`:
    {stage: Prior fields} for stages never run here (eaglelab.eta.prior)."""
    by_name = {s["name"]: s for s in stages}
    priors = priors or {}
    memo: dict[str, dict] = {}

    def finish(name: str, trail: tuple = ()) -> dict:
        if name in memo:
            return memo[name]
        if name in trail:
            raise ValueError(f"dependency cycle among stages: {' -> '.join(trail + (name,))}")
        st = by_name[name]
        # `after`: an order only (the pilot before the rest of synth in its own window), still a later start
        deps = [d for d in (st.get("depends_on") or []) + (st.get("needs") or []) + (st.get("after") or [])
                if d in by_name]
        dep_f = [finish(d, trail + (name,)) for d in deps]
        run = runs_by_id.get(st.get("latest_run") or "") or {}
        state = run.get("state") or st.get("state") or RunState.PENDING
        rec: dict[str, Any] = {"state": state}
        if state == RunState.COMPLETED:
            end = _epoch(run.get("ended_at")) or now
            rec.update(eta=end, low=end, high=end, source="done", basis="done")
        elif (state == RunState.RUNNING and name in run_etas and run_etas[name].get("eta_s") is not None
              and not _size_knows_better(run_etas[name], history, name, st.get("host", ""), profile, priors)):
            e = run_etas[name]
            src = e.get("source", "progress")
            rec.update(eta=now + e["eta_s"], low=now + e["eta_low_s"], high=now + e["eta_high_s"],
                       source=src, basis=BASIS.get(src, src))
        else:
            # Not started (or failed/killed: assumed started again): after its dependencies, or now.
            unknown_dep = any(f["eta"] is None for f in dep_f)
            start = max([now] + [f["eta"] for f in dep_f if f["eta"] is not None])
            start_lo = max([now] + [f["low"] for f in dep_f if f["low"] is not None])
            start_hi = max([now] + [f["high"] for f in dep_f if f["high"] is not None])
            prior = Prior.from_dict(priors[name]) if name in priors else None
            dur, why = stage_estimate(history, name, st.get("host", ""), profile, prior, st.get("kind") == "service")
            if state == RunState.RUNNING:  # running but no estimate of its own: elapsed vs history or prior
                started = _epoch(run.get("started_at")) or now
                start = start_lo = start_hi = started
            if dur is None or unknown_dep:
                waits = next((d for d, f in zip(deps, dep_f) if f["eta"] is None), None)
                rec.update(eta=None, low=None, high=None, source="unknown",
                           reason=why or f"no estimate: waits for {waits}, which has none")
            else:
                rec.update(eta=max(start + dur.eta_s, now), low=max(start_lo + dur.low_s, now),
                           high=max(start_hi + dur.high_s, now), source=dur.source,
                           basis=dur.basis or BASIS.get(dur.source, dur.source))
            rec["start"] = start
            if state in (RunState.FAILED, RunState.KILLED):
                rec["assumes_rerun"] = True
        rec["after"] = max(((f["eta"], d) for f, d in zip(dep_f, deps) if f["eta"] is not None), default=(None, None))[1]
        memo[name] = rec
        return rec

    for s in stages:
        finish(s["name"])
    known = {n: r for n, r in memo.items() if r["eta"] is not None}
    unknown = sorted(n for n, r in memo.items() if r["eta"] is None)
    if not known or unknown:
        return memo, {"finish_at": None, "finish_low_at": None, "finish_high_at": None,
                      "critical_path": [], "unknown": unknown,
                      "unknown_reasons": {n: memo[n].get("reason") or "no estimate" for n in unknown}}
    last = max(known, key=lambda n: known[n]["eta"])
    path = [last]
    while memo[path[-1]].get("after"):
        path.append(memo[path[-1]]["after"])
    path.reverse()
    return memo, {"finish_at": _iso(max(r["eta"] for r in known.values())),
                  "finish_low_at": _iso(max(r["low"] for r in known.values())),
                  "finish_high_at": _iso(max(r["high"] for r in known.values())),
                  "eta_s": seconds(max(r["eta"] for r in known.values()) - now),
                  "critical_path": path, "unknown": []}


def _size_knows_better(run_eta_: dict, history: History, name: str, host: str, profile: str,
                       priors: dict[str, dict]) -> bool:
    """A running run estimated from earlier runs' durations alone (no bar of its own) is better
    estimated from a rate learned per unit x today's size, when one was learned: the size may
    have changed since."""
    if run_eta_.get("source") in ("progress", "mixed") or name not in priors:
        return False
    return learned_span(history, name, host, profile, Prior.from_dict(priors[name])) is not None


def annotate(status: dict, history: dict | History | None, now: float, priors: dict[str, dict] | None = None) -> dict:
    """Add ETA fields to a `lab status --json` object (a new dict; existing fields are kept as they are).

    runs[*].eta, stages[*].eta and top-level `pipeline`; see docs/interfaces.md, "## ETA".
    priors: {stage: {unit, per_s, units, fixed_s, spread, size_how, reason}} (eaglelab.eta.prior)."""
    hist = (history if isinstance(history, History) else History.from_dict(history)).with_status_runs(status)
    profile = status.get("profile", "")
    out = dict(status)
    runs = [dict(r) for r in status.get("runs", [])]
    run_etas: dict[str, dict] = {}  # by stage, for the run that is the stage's latest
    latest = {s.get("latest_run") for s in status.get("stages", [])}
    for r in runs:
        e = run_eta(r, hist, profile, now)
        if e is not None:
            r["eta"] = e
            if r.get("id") in latest:
                run_etas[r.get("stage", "")] = e
    out["runs"] = runs
    stages = [dict(s) for s in status.get("stages", [])]
    memo, pipe = pipeline_finish(stages, {r.get("id"): r for r in runs}, run_etas, hist, profile, now, priors)
    for s in stages:
        m = memo[s["name"]]
        s["eta"] = {"eta_s": None if m["eta"] is None else seconds(max(m["eta"] - now, 0.0)),
                    "eta_low_s": None if m["low"] is None else seconds(max(m["low"] - now, 0.0)),
                    "eta_high_s": None if m["high"] is None else seconds(max(m["high"] - now, 0.0)),
                    "finish_at": _iso(m["eta"]), "finish_low_at": _iso(m["low"]),
                    "finish_high_at": _iso(m["high"]), "source": m["source"]}
        for key in ("basis", "reason"):  # in words: "prior: ...", "learned from 2 runs: ...", "live"
            if m.get(key):
                s["eta"][key] = m[key]
        if m.get("start") is not None and m["state"] != RunState.RUNNING and m["eta"] is not None:
            s["eta"]["start_at"] = _iso(m["start"])  # (no start time for a stage whose finish is unknown)
        if m.get("assumes_rerun"):
            s["eta"]["assumes_rerun"] = True
        run = next((r for r in runs if r.get("id") == s.get("latest_run") and r.get("eta")), None)
        if run is not None and m["source"] in ("prior", "learned"):
            # the run's own ETA had nothing better (no bar): it says what the stage says
            run["eta"] = {**run["eta"], **{k: s["eta"][k] for k in ("eta_s", "eta_low_s", "eta_high_s", "finish_at",
                                                                    "source", "basis") if k in s["eta"]}}
    out["stages"] = stages
    out["pipeline"] = pipe
    return out
