"""`lab parse FILE`: a whole log's final state; `lab tail DIR...`: keep run directories' state.json live."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import click

from eaglelab.host.tail.frames import SAMPLE_BYTES
from eaglelab.host.tail.many import watch_runs
from eaglelab.host.tail.whole import parse_file


@click.command("parse")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the state JSON (schema 1).")
@click.option("--history", is_flag=True, help="Include every bar's observation history (n, total, elapsed_s).")
@click.option("--every-frame", is_flag=True,
              help="Read every \\r-frame of long frame runs (default: one per 256 KiB, and the last).")
def parse_cmd(file: Path, as_json: bool, history: bool, every_frame: bool) -> None:
    """Parse a whole log FILE and print its final state: state, failure, progress, phases, metrics."""
    state = parse_file(file, include_history=history, sample_bytes=0 if every_frame else SAMPLE_BYTES)
    if as_json:
        click.echo(json.dumps(state, sort_keys=False))
        return
    click.echo(summary(state))


def summary(s: dict) -> str:
    """A few lines a person reads: the state JSON's gist."""
    out = [f"state: {s['state']}   lines: {s['lines']}   bad lines: {s['bad_lines']}"]
    if s.get("failure"):
        f = s["failure"]
        out.append(f"failure: {f['reason']} (line {f['line']}): {f['message']}")
    if s.get("phase") or s.get("phases"):
        names = " -> ".join(p["name"] + (f" ({p['duration_s']:.1f} s)" if p.get("duration_s") is not None else "")
                            for p in s["phases"][-8:])
        out.append(f"phase: {s.get('phase')}   phases: {names}")
    p = s.get("progress")
    if p:
        total = p["total"] if p["total"] is not None else "?"
        eta = f"{p['eta_s']:.0f} s" if p.get("eta_s") is not None else "?"
        out.append(f"progress: {p['label'] or '(bar)'} {p['n']}/{total}   elapsed {p['elapsed_s']} s   eta {eta}")
    if s.get("metrics"):
        last = ", ".join(f"{k}={v[-1][1]:g}" for k, v in list(s["metrics"].items())[:6] if v)
        out.append(f"metrics: {last}")
    if s.get("stall"):
        out.append(f"stalled: {s['stall']['message']}")
    return "\n".join(out)


@click.command("tail")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(path_type=Path, file_okay=False))
@click.option("--once", is_flag=True, help="One pass over every run, then exit (for cron and scripts).")
def tail_cmd(dirs: tuple[Path, ...], once: bool) -> None:
    """Watch run directories (or directories of runs) and keep each run's state.json up to date.

    A DIR holding output.log or meta.json is one run; any other DIR is watched for runs inside it,
    including ones that appear later. Runs that have ended get a final state and are let go.
    """
    stop = threading.Event()
    if not once:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    n = watch_runs(list(dirs), stop, once=once)
    click.echo(f"lab tail: {n} run(s) followed")


COMMANDS = [parse_cmd, tail_cmd]
