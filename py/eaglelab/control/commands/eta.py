"""`lab eta replay FILE --json`: a log's progress lines through the ETA estimator, one row per frame."""

from __future__ import annotations

import json

import click

from eaglelab.eta.replay import replay


@click.group("eta")
def eta_group() -> None:
    """ETAs: replay a log through the estimator."""


@eta_group.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="one JSON object per progress frame (the stable format)")
def replay_cmd(file: str, as_json: bool) -> None:
    """Replay FILE's progress frames: for each, the ETA computed only from the frames up to it,
    beside the remaining time the frame itself printed (tqdm's)."""
    with open(file, "rb") as f:  # line by line on b"\n" only: "\r" frames are split by replay
        lines = (raw.decode("utf-8", errors="replace") for raw in f)
        _print_rows(lines, as_json)


def _print_rows(lines, as_json: bool) -> None:
    for row in replay(lines):
        d = row.public()
        if as_json:
            click.echo(json.dumps(d))
        else:
            fmt = lambda v: "?" if v is None else f"{v:.0f}s"
            click.echo(f"{d['label'] or '(bar)'} {d['n']}/{d['total']} eta {fmt(d['eta_s'])} "
                       f"[{fmt(d['eta_low_s'])}..{fmt(d['eta_high_s'])}] tqdm {fmt(d['tqdm_eta_s'])}")


COMMANDS = [eta_group]
