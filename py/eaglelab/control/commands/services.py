"""`lab services`: the running services, in use or idle (and what they hold); `--reap` stops the
ones idle past their keep-alive (eaglelab.control.pipeline.services)."""

from __future__ import annotations

import json
import sys
import time

import click

from ..pipeline import services as services_mod
from ..render import fmt_duration


@click.command("services")
@click.option("--reap", is_flag=True, help="Stop the services idle for longer than their keep_alive_s.")
@click.option("--after", "after_s", type=float, default=None, metavar="S",
              help="With --reap: wait S seconds first, then keep reaping while services stay idle.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def services(ctx: click.Context, reap: bool, after_s: float | None, as_json: bool) -> None:
    """Running services: which jobs use them, or how long they have been idle and when they stop."""
    lab = ctx.find_root().obj.lab
    if reap and after_s is not None:
        services_mod.reap_until_none_idle(lab, after_s, sys.stdout)
        return
    lab.refresh()
    if reap:
        services_mod.reap(lab, sys.stdout)
    now = time.time()
    rows = services_mod.usage(lab, now)
    if as_json:
        click.echo(json.dumps({"schema": 1, "services": rows}, indent=1))
        return
    if not rows:
        click.echo("no service is running")
    for u in rows:
        holds = f", holds {u['gpus']} GPU(s) on {u['host']}" if u["gpus"] else f" on {u['host']}"
        if u["in_use_by"]:
            click.echo(f"{u['service']:<16} in use by {', '.join(u['in_use_by'])}{holds}")
        else:
            click.echo(f"{u['service']:<16} IDLE for {fmt_duration(u['idle_s'])}{holds}; stops in "
                       f"{fmt_duration(u['stops_in_s'])} (keep_alive_s {u['keep_alive_s']:.0f}; "
                       f"`lab stop {u['service']}` now)")


COMMANDS = [services]
