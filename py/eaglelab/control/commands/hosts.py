"""Commands for the lab's hosts: `lab preflight STAGE`, `lab sync HOST`, `lab mirror TARGET`."""

from __future__ import annotations

import json
import sys

import click

from .. import preflight as preflight_mod
from eaglelab.errors import HostError


def _lab(ctx: click.Context):
    return ctx.find_root().obj.lab


@click.command()
@click.argument("stage")
@click.option("--json", "as_json", is_flag=True, help="The checks as one JSON object.")
@click.pass_context
def preflight(ctx: click.Context, stage: str, as_json: bool) -> None:
    """Check STAGE's host before launching: reachable, env == lock, disk, GPUs, inputs."""
    lab = _lab(ctx)
    checks = preflight_mod.run(lab, stage)
    ok = all(c.ok is not False for c in checks)
    if as_json:
        click.echo(json.dumps({"schema": 1, "stage": stage, "host": lab.cfg.stage(stage).host, "ok": ok,
                               "checks": preflight_mod.as_dicts(checks)}, indent=1))
    else:
        for c in checks:
            click.echo(c.line())
        click.echo(f"preflight {stage}: {'ready' if ok else 'NOT ready'}")
    if not ok:
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("host")
@click.pass_context
def sync(ctx: click.Context, host: str) -> None:
    """Copy the project to HOST (rsync over ssh) and make its venv from the host's lock."""
    from ..executors.ssh import SshExecutor
    from ..sync import sync as do_sync
    lab = _lab(ctx)
    lab.cfg.host(host)  # a clear error for an unknown name
    ex = lab.executor(host)
    if not isinstance(ex, SshExecutor):
        raise HostError(f"host {host!r} is not reached over ssh; `lab sync` copies to ssh hosts only")
    do_sync(ex, out=sys.stdout)


@click.command()
@click.argument("target")
@click.pass_context
def mirror(ctx: click.Context, target: str) -> None:
    """Bring the controller's copy of TARGET's log (logs/mirror/HOST/RUN.log) up to date."""
    lab = _lab(ctx)
    rec = lab.resolve_run(target)
    ex = lab.executor(rec["host"])
    mirror_ = getattr(ex, "mirror", None)
    if mirror_ is None:
        click.echo(f"lab: {rec['id']} runs on {rec['host']} (local): its log is {rec.get('run_dir')}/output.log")
        return
    size = mirror_.sync(ex, rec["id"])
    click.echo(f"{mirror_.path(rec['host'], rec['id'])} {size} bytes")


COMMANDS = [preflight, sync, mirror]
