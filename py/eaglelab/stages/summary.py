"""What the pipeline produced, from the stages' manifests alone (no model loads): sizes, vocab
coverage, acceptance, speedup and verdict, and where each output is. For the end of `make demo`.

    python -m eaglelab.stages.summary --data data/demo [--json]
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from .. import manifest
from ..fsutil import read_json


def collect(data: Path) -> dict:
    """{stage: facts} for every stage output found under data (pure reads; absent stages omitted)."""
    out: dict = {}
    parts = {"model": "model", "synth": "synth", "prepare": "prepared", "extract": "hidden_states",
             "vocab": "vocab", "train": "checkpoints", "eval": "eval"}
    for stage, sub in parts.items():
        doc = manifest.read(data / sub)
        if doc is None:
            continue
        out[stage] = {"path": str(data / sub), "counts": doc.get("counts", {}), "bytes": doc.get("total_bytes", 0),
                      "fingerprint": doc.get("fingerprint"), "extra": doc.get("extra", {}),
                      "params": doc.get("params", {})}
    cov = read_json(data / "vocab" / "coverage.json")
    if cov and "vocab" in out:
        out["vocab"]["coverage"] = cov.get("coverage")
    rep = read_json(data / "eval" / "report.json")
    if rep:
        out.setdefault("eval", {"path": str(data / "eval")})
        out["eval"]["report"] = {k: rep.get(k) for k in (
            "acceptance_rate", "mean_acceptance_length", "per_position_acceptance", "speedup", "verdict",
            "reasons", "baseline_tokens_per_s", "spec_tokens_per_s", "drafts")}
    return out


def lines(s: dict) -> list[str]:
    rows = []

    def add(stage, text):
        rows.append(f"  {stage:<8} {text:<62} {s[stage]['path']}")

    if "model" in s:
        c = s["model"]["counts"]
        add("model", f"{c.get('parameters', 0) / 1e6:.2f} M parameters, {c.get('shards')} shards, vocab {c.get('vocab')}")
    if "synth" in s:
        c = s["synth"]["counts"]
        add("synth", f"{c.get('done')}/{c.get('prompts')} conversations, {c.get('truncated')} truncated, "
                     f"{c.get('errors')} errors, {c.get('tokens')} tokens")
    if "prepare" in s:
        c = s["prepare"]["counts"]
        add("prepare", f"{c.get('samples')} samples, {c.get('tokens')} tokens ({c.get('supervised_tokens')} supervised)")
    if "extract" in s:
        c, p = s["extract"]["counts"], s["extract"]["params"]
        add("extract", f"{c.get('samples')} hs files, {s['extract']['bytes'] / 1e6:.1f} MB, layers {p.get('layer_ids')}")
    if "vocab" in s:
        c = s["vocab"]["counts"]
        cov = s["vocab"].get("coverage")
        add("vocab", f"{c.get('draft_vocab_size')} of {c.get('target_vocab_size')} tokens, coverage "
                     + (f"{cov:.1%}" if cov is not None else "?"))
    if "train" in s:
        c = s["train"]["counts"]
        add("train", f"{c.get('epochs_done')} epochs, drafter {s['train']['extra'].get('last_checkpoint')}")
    r = s.get("eval", {}).get("report")
    if r:
        add("eval", f"acceptance {r['acceptance_rate']:.1%}, mean acceptance length {r['mean_acceptance_length']:.2f}, "
                    f"speedup {r['speedup']:.2f}x: {r['verdict']}")
    return rows


@click.command()
@click.option("--data", required=True, type=click.Path(path_type=Path), help="the profile's data directory")
@click.option("--json", "as_json", is_flag=True)
def main(data: Path, as_json: bool) -> None:
    """Summarize the pipeline's outputs under DATA."""
    s = collect(data)
    if as_json:
        click.echo(json.dumps({"schema": 1, "data": str(data), "stages": s}, indent=1))
        return
    click.echo(f"pipeline outputs under {data}:")
    for line in lines(s):
        click.echo(line)


if __name__ == "__main__":
    main()
