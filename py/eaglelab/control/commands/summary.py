"""`lab summary`: what the pipeline did — per-stage durations from the registry, and the headline
figures (vocab coverage, acceptance, speedup, verdict) from the manifests the stages wrote."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import click

from eaglelab.errors import EaglelabError

from ..foresight import forecast
from ..foresight.forecast import DECODINGS, decoded
from ..lab import Lab
from ..render import fmt_duration

# Figures a stage's manifest may carry under `extra`, shown first, in this order.
HEADLINE = (("coverage", "vocab coverage", "{:.1%}"), ("acceptance_rate", "acceptance rate", "{:.1%}"),
            ("mean_acceptance_length", "mean acceptance length", "{:.2f}"),
            ("speedup", "speedup vs no speculation", "{:.2f}x"), ("verdict", "verdict", "{}"),
            ("decided_at", "verdict decided at", "{}"), ("window", "tokens measured", "{}"))


def read_manifests(lab: Lab, names: list[str]) -> dict[str, dict[str, dict | None]]:
    """{stage: {output: manifest}}, each read on the stage's own host (one call per host, in parallel);
    a host that does not answer gives no manifests (and says so on stderr), not an error."""
    by_host: dict[str, list[str]] = {}
    for n in names:
        by_host.setdefault(lab.cfg.stage(n).host, []).append(n)

    def on_host(host: str) -> dict:
        ex, found = lab.executor(host), {}
        specs = {n: lab.launch_spec(lab.cfg.stage(n)) for n in by_host[host]}
        paths = sorted({o for s in specs.values() for o in s["outputs"]})
        try:
            docs = ex.manifests(paths, ex.repo_dir()) if paths else {}
        except EaglelabError as e:
            click.echo(f"lab summary: no manifests from {host}: {e}", err=True)
            docs = {}
        for n, s in specs.items():
            found[n] = {o: docs.get(o) for o in s["outputs"]}
        return found

    out: dict = {}
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(by_host)))) as pool:
        for part in pool.map(on_host, by_host):
            out.update(part)
    return out


def summarize(lab: Lab) -> dict:
    """Per job stage: latest run, state, duration, output manifests (read where they are); plus the
    headline figures."""
    stages, headline = [], {}
    names = [n for n in lab.cfg.stage_order() if lab.cfg.stage(n).kind == "job"]
    docs = read_manifests(lab, names)
    for name in names:
        stage = lab.cfg.stage(name)
        run = lab.latest(name) or {}
        outputs = []
        for out, manifest in docs.get(name, {}).items():
            outputs.append({"path": out, "counts": (manifest or {}).get("counts"),
                            "bytes": (manifest or {}).get("total_bytes")})
            for key in [k for k, *_ in HEADLINE] + ["sweep"]:
                if manifest and key in (manifest.get("extra") or {}):
                    headline[key] = manifest["extra"][key]
        stages.append({"stage": name, "host": stage.host, "run": run.get("id"), "state": run.get("state", "pending"),
                       "duration_s": run.get("duration_s"), "outputs": outputs})
    total = sum(s["duration_s"] or 0 for s in stages)
    pipe = forecast.annotate(lab, {"runs": lab.registry.runs()})["pipeline"]
    return {"schema": 1, "profile": lab.cfg.profile, "stages": stages, "headline": headline,
            "total_duration_s": total, "forecast": pipe["forecast"], "forecast_vs_eval": _versus(pipe["forecast"]),
            "pilot_vs_eval": _versus(pipe["forecast"], "pilot")}


def _versus(fc: dict | None, key: str = "offline") -> dict | None:
    """An offline forecast (the last one, or the pilot's) next to the served measurement, once both exist."""
    if not fc or fc.get("source") != "eval" or not fc.get(key):
        return None

    off = {"source": "pilot", **fc[key]}  # "offline" names its own source; "pilot" holds only figures
    decoding = fc.get("decoding") if fc.get("decoding") in DECODINGS else "greedy"  # as the eval decided
    out = {"decoding": decoding, "window": fc.get("window"), "forecast_source": off["source"]}
    for name in DECODINGS:  # each forecast beside the served cell of its own decoding
        f, m = decoded(off, name), decoded(fc, name)
        if f is not None and m is not None:
            out.update({f"forecast_{name}_rate": f["acceptance_rate"], f"measured_{name}_rate": m["acceptance_rate"],
                        f"{name}_error": f["acceptance_rate"] - m["acceptance_rate"],
                        f"forecast_{name}_length": f["mean_acceptance_length"],
                        f"measured_{name}_length": m["mean_acceptance_length"],
                        **({f"{name}_engine_fault": m["engine_fault"]} if m.get("engine_fault") else {})})
    if f"{decoding}_error" not in out:
        return None
    out.update({"forecast_rate": out[f"forecast_{decoding}_rate"], "measured_rate": out[f"measured_{decoding}_rate"],
                "error": out[f"{decoding}_error"], "forecast_length": out[f"forecast_{decoding}_length"],
                "measured_length": out[f"measured_{decoding}_length"]})
    return out


@click.command("summary")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_obj
def summary(ctx, as_json: bool) -> None:
    """What the pipeline did: per-stage durations, coverage, acceptance, speedup, where outputs are."""
    lab: Lab = ctx.lab
    lab.refresh()
    s = summarize(lab)
    if as_json:
        click.echo(json.dumps(s, indent=1))
        return
    click.echo(f"pipeline summary (profile {s['profile']})")
    for st in s["stages"]:
        outs = ", ".join(o["path"] + (f" ({_counts(o['counts'])})" if o["counts"] else "") for o in st["outputs"])
        click.echo(f"  {st['stage']:<14} {st['state']:<10} {fmt_duration(st['duration_s']):>8}  {outs}")
    click.echo(f"  {'total':<14} {'':<10} {fmt_duration(s['total_duration_s']):>8}")
    for key, label, fmt in HEADLINE:
        if key in s["headline"]:
            value = s["headline"][key]
            click.echo(f"{label}: {fmt.format(value) if value is not None else 'n/a'}")
    for cell in s["headline"].get("sweep") or []:  # the eval's sweep, one line per cell
        if isinstance(cell, dict):
            click.echo(f"  {cell.get('sampling')} at concurrency {cell.get('concurrency')}: speedup "
                       f"{cell.get('speedup') or 0:.2f}x, acceptance {cell.get('acceptance_rate') or 0:.1%}, "
                       f"{cell.get('verdict')}")
    fc = s["forecast"]
    for vs in [v for v in (s["pilot_vs_eval"], s["forecast_vs_eval"]) if v]:  # earliest evidence first
        other = "greedy" if vs["decoding"] == "sampled" else "sampled"
        fl, ml = vs["forecast_length"], vs["measured_length"]
        # the verdict's decoding first ("sampled acceptance" where it is decided sampled), the other beside
        click.echo(f"forecast ({vs['forecast_source']}) vs eval: {'sampled ' if vs['decoding'] == 'sampled' else ''}acceptance "
                   f"{vs['forecast_rate']:.1%} forecast, {vs['measured_rate']:.1%} measured (error {vs['error']:+.1%})"
                   + (f"; mean length {fl:.2f} vs {ml:.2f}" if fl is not None and ml is not None else "")
                   + (f"; {other} {vs[f'forecast_{other}_rate']:.1%} forecast, {vs[f'measured_{other}_rate']:.1%} "
                      f"measured (error {vs[f'{other}_error']:+.1%})" if f"{other}_error" in vs else "")
                   + ("; the sampled figure was served by a broken sampling path (ENGINE OUTPUT FAULT in the "
                      "eval's log): the engine's error, not the forecast's" if vs.get("sampled_engine_fault") else ""))
    if not s["forecast_vs_eval"] and fc and "acceptance_rate" in fc:
        click.echo(f"forecast: {fc['verdict']}, acceptance {fc['acceptance_rate']:.1%}, mean length "
                   f"{fc['mean_acceptance_length']:.2f} (from {fc['source']}; no eval to compare with yet)")


def _counts(c: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.items() if isinstance(v, (int, float)))


COMMANDS = [summary]
