"""Each stage's `prior:` with its input's size now, for first-run ETAs (eaglelab.eta.prior): the
size is measured on the stage's host (one call per host, eaglelab.host.sizes) when the status asks
the hosts, else the last measurement the registry kept. A finished run's size is recorded once,
so its duration teaches a rate (the learned prior)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from eaglelab import config as config_mod
from eaglelab.config import StageConfig
from eaglelab.fsutil import parse_iso
from eaglelab.model import RunState

from .lab import Lab

TRANSFER_BYTES_PER_S = 1.0e8  # a transfer stage's prior: ~a 1 Gb/s link (no seed figure; x3 range)


@dataclass
class _Plan:
    """What to measure for one stage's prior, where, and the prior's declared figures."""

    host: str
    requests: list[dict]  # measured on `host`; sizes summed (a transfer moves several paths)
    nums: dict  # config.prior_numbers: measure, limit, expected, times
    fields: dict  # unit, per_s, fixed_s, spread


def _plan(lab: Lab, stage: StageConfig) -> _Plan | None:
    """A stage's declared prior, or for a transfer stage eaglelab added, the bytes of the paths it
    moves (measured on the producer's host) at TRANSFER_BYTES_PER_S; None without either."""
    if stage.prior is not None:
        p = stage.prior
        nums = config_mod.prior_numbers(lab.cfg, stage)
        reqs = []
        if nums["measure"]:
            ex = lab.executor(stage.host)  # the path as the host sees it (rendered like inputs at launch)
            variables = lab.cfg.vars_for(stage, repo=ex.repo_dir(), python=ex.python, work_dir=ex.work_dir)
            reqs = [{"path": lab.cfg.render(stage, nums["measure"], variables), "unit": p.unit, "count": p.count}]
        return _Plan(stage.host, reqs, nums, {"unit": p.unit, "per_s": p.per_s, "fixed_s": p.fixed_s,
                                              "spread": p.spread})
    t = getattr(stage, "transfer", None)
    if t is not None and t.paths:
        return _Plan(t.src, [{"path": path, "unit": "bytes", "count": None} for path in t.paths],
                     {"measure": " + ".join(t.paths), "limit": None, "expected": 0.0, "times": None,
                      "fallback_how": f"0 bytes counted until {t.producer} has written them"},
                     {"unit": "bytes", "per_s": TRANSFER_BYTES_PER_S, "fixed_s": 5.0, "spread": 3.0})
    return None


def measure_sizes(lab: Lab, plans: dict[str, _Plan]) -> dict[str, dict]:
    """{stage: {path, unit, size, how | reason, host}} measured now, one call per host; a host
    that does not answer gives each of its stages that as the reason."""
    by_host: dict[str, list[tuple[str, _Plan]]] = {}
    for name, plan in plans.items():
        if plan.requests:
            by_host.setdefault(plan.host, []).append((name, plan))
    out: dict[str, dict] = {}
    for host, items in by_host.items():
        ex = lab.executor(host)
        flat = [r for _, plan in items for r in plan.requests]
        try:
            answers = ex.input_sizes(flat, ex.repo_dir())
        except Exception as e:  # noqa: BLE001 - an unreachable host or an old one: said, never fatal
            answers = [{"size": None, "reason": f"host {host!r} did not measure it ({str(e)[:200]})",
                        "unanswered": True}] * len(flat)
        i = 0
        for name, plan in items:
            mine, i = answers[i:i + len(plan.requests)], i + len(plan.requests)
            missing = next((a for a in mine if a.get("size") is None), None)
            ans = missing or {"size": sum(float(a["size"]) for a in mine),
                              "how": " + ".join(str(a.get("how")) for a in mine)}
            out[name] = {"host": host, "path": plan.nums["measure"], "unit": plan.fields["unit"], **ans}
    return out


def stage_priors(lab: Lab, runs: list[dict], refresh: bool) -> tuple[dict[str, dict], list[dict]]:
    """({stage: eaglelab.eta.prior.Prior fields} for every stage with a prior (declared, or a
    transfer's), the registry's run_units rows): with refresh, sizes are measured when due (and
    stored), and the latest completed run of a stage whose size is not recorded yet gets the
    measurement recorded."""
    plans = {n: plan for n in lab.cfg.stage_order() if (plan := _plan(lab, lab.cfg.stage(n))) is not None}
    profile = lab.cfg.profile
    stored = lab.registry.input_sizes(profile)
    units_rows = lab.registry.run_units()
    known_units = {r["run_id"] for r in units_rows}
    measured = [n for n, plan in plans.items() if plan.requests]
    fresh = measure_sizes(lab, plans) if refresh and _due(measured, stored, runs) else {}
    keep = [{"stage": n, "profile": profile, **m} for n, m in fresh.items() if not m.get("unanswered")]
    lab.registry.record_input_sizes(keep)
    out, learn = {}, []
    for name, plan in plans.items():
        m = fresh.get(name) if name in fresh and not fresh[name].get("unanswered") else stored.get(name, fresh.get(name))
        units, how, reason, measured_now = _size(plan.nums, m)
        out[name] = {**plan.fields, "units": units, "size_how": how, "reason": reason}
        latest = next((r for r in reversed(runs) if r.get("stage") == name), None)
        if (refresh and measured_now and units is not None and lab.cfg.stage(name).kind == "job" and latest
                and latest.get("state") == RunState.COMPLETED and latest.get("id") not in known_units
                and (name in fresh or not plan.requests)):
            learn.append({"run_id": latest["id"], "stage": name, "host": latest.get("host"),
                          "profile": latest.get("profile") or profile, "unit": plan.fields["unit"],
                          "units": units, "how": how})
    lab.registry.record_run_units(learn)
    return out, units_rows + learn


MEASURE_EVERY_S = 60.0  # the page refreshes every 2 s: sizes change when a stage ends, not that often


def _due(names: list[str], stored: dict[str, dict], runs: list[dict]) -> bool:
    """Measure again: a stage never measured, a measurement older than MEASURE_EVERY_S, or any run
    that began or ended since (an upstream's outputs are a stage's inputs; a finished run's size
    is recorded from the measurement after its end)."""
    if any(n not in stored for n in names):
        return True
    if not names:
        return False
    oldest = min(parse_iso(stored[n].get("measured_at")) or 0.0 for n in names)
    if time.time() - oldest > MEASURE_EVERY_S:
        return True
    return any((parse_iso(r.get(k)) or 0.0) >= oldest for r in runs for k in ("started_at", "ended_at"))


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
            how = nums.get("fallback_how") or f"prior.{'expected' if expected is not None else 'limit'} {_num(fallback)}"
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
