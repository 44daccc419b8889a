"""Each stage's `prior:` with its input's size now, for first-run ETAs (eaglelab.eta.prior): the
size is measured on the stage's host (one call per host, eaglelab.host.sizes) when the status asks
the hosts, else the last measurement the registry kept. A finished run's size is recorded once,
so its duration teaches a rate (the learned prior)."""

from __future__ import annotations

import time

from eaglelab import config as config_mod
from eaglelab.config import StageConfig
from eaglelab.fsutil import parse_iso

from .lab import Lab


def _request(lab: Lab, stage: StageConfig, measure: str) -> dict:
    """The measure path as the stage's host sees it (rendered like its inputs at launch)."""
    ex = lab.executor(stage.host)
    variables = lab.cfg.vars_for(stage, repo=ex.repo_dir(), python=ex.python, work_dir=ex.work_dir)
    assert stage.prior is not None
    return {"path": lab.cfg.render(stage, measure, variables), "unit": stage.prior.unit, "count": stage.prior.count}


def measure_sizes(lab: Lab, names: list[str]) -> dict[str, dict]:
    """{stage: {path, unit, size, how | reason, host}} measured now, one call per host; a host
    that does not answer gives each of its stages that as the reason."""
    by_host: dict[str, list[tuple[str, dict]]] = {}
    for name in names:
        s = lab.cfg.stage(name)
        nums = config_mod.prior_numbers(lab.cfg, s)
        if nums["measure"]:
            by_host.setdefault(s.host, []).append((name, _request(lab, s, nums["measure"])))
    out: dict[str, dict] = {}
    for host, items in by_host.items():
        ex = lab.executor(host)
        try:
            answers = ex.input_sizes([r for _, r in items], ex.repo_dir())
        except Exception as e:  # noqa: BLE001 - an unreachable host or an old one: said, never fatal
            answers = [{"size": None, "reason": f"host {host!r} did not measure it ({str(e)[:200]})",
                        "unanswered": True}] * len(items)
        for (name, req), ans in zip(items, answers):
            out[name] = {"host": host, "path": req["path"], "unit": req["unit"], **ans}
    return out


def stage_priors(lab: Lab, runs: list[dict], refresh: bool) -> dict[str, dict]:
    """{stage: eaglelab.eta.prior.Prior fields} for every stage that declares a prior; with refresh,
    sizes are measured now (and stored), and the latest completed run of a stage whose size is
    not recorded yet gets today's measurement recorded."""
    names = [n for n in lab.cfg.stage_order() if lab.cfg.stage(n).prior is not None]
    profile = lab.cfg.profile
    stored = lab.registry.input_sizes(profile)
    known_units = {r["run_id"] for r in lab.registry.run_units()}
    measured = [n for n in names if lab.cfg.stage(n).prior.measure]  # type: ignore[union-attr]
    fresh = measure_sizes(lab, names) if refresh and _due(measured, stored, runs, known_units) else {}
    keep = [{"stage": n, "profile": profile, **m} for n, m in fresh.items() if not m.get("unanswered")]
    lab.registry.record_input_sizes(keep)
    out, learn = {}, []
    for name in names:
        s = lab.cfg.stage(name)
        p = s.prior
        assert p is not None
        nums = config_mod.prior_numbers(lab.cfg, s)
        m = fresh.get(name) if name in fresh and not fresh[name].get("unanswered") else stored.get(name, fresh.get(name))
        units, how, reason, measured = _size(nums, m)
        out[name] = {"unit": p.unit, "per_s": p.per_s, "fixed_s": p.fixed_s, "spread": p.spread,
                     "units": units, "size_how": how, "reason": reason}
        latest = next((r for r in reversed(runs) if r.get("stage") == name), None)
        if (refresh and measured and units is not None and s.kind == "job" and latest
                and latest.get("state") == "completed" and latest.get("id") not in known_units
                and (name in fresh or not nums["measure"])):
            learn.append({"run_id": latest["id"], "stage": name, "host": latest.get("host"),
                          "profile": latest.get("profile") or profile, "unit": p.unit, "units": units, "how": how})
    lab.registry.record_run_units(learn)
    return out


MEASURE_EVERY_S = 60.0  # the page refreshes every 2 s: sizes change when a stage ends, not that often


def _due(names: list[str], stored: dict[str, dict], runs: list[dict], known_units: set) -> bool:
    """Measure again: a stage never measured, a measurement older than MEASURE_EVERY_S, a run of
    a stage that began since, or one that completed since and has no size recorded yet."""
    if any(n not in stored for n in names):
        return True
    seen = {n: parse_iso(stored[n].get("measured_at")) or 0.0 for n in names}
    if names and time.time() - min(seen.values()) > MEASURE_EVERY_S:
        return True
    latest = {r.get("stage"): r for r in runs}  # runs are oldest first
    for n in names:
        r = latest.get(n) or {}
        if (parse_iso(r.get("started_at")) or 0.0) >= seen[n]:
            return True  # a run began since: on today's input
        if (r.get("state") == "completed" and r.get("id") not in known_units
                and (parse_iso(r.get("ended_at")) or 0.0) >= seen[n]):
            return True
    return False


def _size(nums: dict, m: dict | None) -> tuple[float | None, str, str | None, bool]:
    """(units, how, reason, measured): the measured size capped at limit, else expected or limit
    (with the reason the measure could not be used), times the passes."""
    limit, expected, times = nums["limit"], nums["expected"], nums["times"] or 1.0
    size = how = reason = None
    measured = False
    if nums["measure"] and m and m.get("size") is not None:
        size, how, measured = float(m["size"]), str(m.get("how") or m.get("path")), True
        if limit is not None and size > limit:
            size, how = limit, f"{how}, at most prior.limit {_num(limit)}"
    else:
        if nums["measure"]:
            reason = (m or {}).get("reason") or f"{nums['measure']} not measured yet"
        fallback = expected if expected is not None else limit
        if fallback is not None:
            size = fallback
            how = f"prior.{'expected' if expected is not None else 'limit'} {_num(fallback)}"
            measured = not nums["measure"]  # a declared size is the size when there is nothing to measure
            if reason:
                how += f", since {reason}"
        elif not reason:
            reason = "the prior declares no measure, limit or expected"
    if size is None:
        return None, "", reason, False
    if times != 1.0:
        how = f"{how}, x {_num(times)} passes"
    return size * times, how or "", reason, measured


def _num(v: float) -> str:
    return f"{v:,.0f}" if v == int(v) else f"{v:,.6g}"
