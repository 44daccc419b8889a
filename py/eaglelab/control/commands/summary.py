"""`lab summary`: what the pipeline did — per-stage durations from the registry, and the headline
figures (vocab coverage, acceptance, speedup, verdict) from the manifests the stages wrote."""

from __future__ import annotations

import json
from pathlib import Path

import click

from eaglelab.fsutil import read_json
from ..lab import Lab
from ..render import fmt_duration

# Figures a stage's manifest may carry under `extra`, shown first, in this order.
HEADLINE = (("coverage", "vocab coverage", "{:.1%}"), ("acceptance_rate", "acceptance rate", "{:.1%}"),
            ("mean_acceptance_length", "mean acceptance length", "{:.2f}"),
            ("speedup", "speedup vs no speculation", "{:.2f}x"), ("verdict", "verdict", "{}"))


def summarize(lab: Lab) -> dict:
    """Per job stage: latest run, state, duration, output manifests; plus the headline figures."""
    stages, headline = [], {}
    for name in lab.cfg.stage_order():
        stage = lab.cfg.stage(name)
        if stage.kind != "job":
            continue
        run = lab.latest(name) or {}
        spec = lab.launch_spec(stage)
        outputs = []
        for out in spec["outputs"]:
            path = Path(spec["cwd"], out) if lab.cfg.host(stage.host).reach == "local" else None
            manifest = read_json(path / "manifest.json") if path is not None and path.is_dir() else None
            outputs.append({"path": out, "counts": (manifest or {}).get("counts"),
                            "bytes": (manifest or {}).get("total_bytes")})
            for key, *_ in HEADLINE:
                if manifest and key in (manifest.get("extra") or {}):
                    headline[key] = manifest["extra"][key]
        stages.append({"stage": name, "host": stage.host, "run": run.get("id"), "state": run.get("state", "pending"),
                       "duration_s": run.get("duration_s"), "outputs": outputs})
    total = sum(s["duration_s"] or 0 for s in stages)
    return {"schema": 1, "profile": lab.cfg.profile, "stages": stages, "headline": headline,
            "total_duration_s": total}


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


def _counts(c: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.items() if isinstance(v, (int, float)))


COMMANDS = [summary]
