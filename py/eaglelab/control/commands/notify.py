"""`lab notify test|log`: try the configured webhooks, and see what was delivered (eaglelab.control.notify)."""

from __future__ import annotations

import datetime as dt
import json

import click

from eaglelab.errors import ConfigError

from .. import notify as notifylib


def _lab(ctx: click.Context):
    return ctx.find_root().obj.lab


@click.group("notify")
def notify() -> None:
    """Webhook notifications: stage completed / failed / stalled, pipeline finished."""


@notify.command("test")
@click.pass_context
def test(ctx: click.Context) -> None:
    """POST a test message to every configured webhook now and say how each answered."""
    lab = _lab(ctx)
    cfg = lab.cfg.lab.notify
    if not cfg.webhooks:
        raise ConfigError(f"{lab.cfg.conf_dir / 'lab.yaml'}: notify.webhooks is empty; add e.g.\n"
                          f"notify:\n  webhooks:\n    - {{url: 'https://hooks.slack.com/services/...', format: slack}}")
    payload = {"schema": 1, "event": "test", "stage": None, "host": None, "status_url": cfg.status_url,
               "text": "eaglelab test message: this webhook works", "reason": None}
    failed = 0
    for hook in cfg.webhooks:
        body, headers = notifylib.render(hook.format, payload)
        try:
            notifylib.post(hook.resolved_url(), body, headers)
            click.echo(f"ok      {notifylib.redact_url(hook.resolved_url())} ({hook.format})")
        except Exception as e:  # noqa: BLE001 - each hook's failure is shown, the next one still tried
            failed += 1
            click.echo(f"FAILED  {notifylib.redact_url(hook.resolved_url())} ({hook.format}): {type(e).__name__}: "
                       f"{getattr(e, 'reason', None) or e}")
    if failed:
        raise click.exceptions.Exit(1)


@notify.command("log")
@click.option("-n", "limit", default=20, show_default=True, help="How many deliveries.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: {schema, deliveries: [...]}.")
@click.pass_context
def log(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The latest webhook deliveries: event, stage, webhook, state (sent/pending/failed), attempts."""
    rows = notifylib.deliveries(_lab(ctx).registry.path, limit)
    if as_json:
        click.echo(json.dumps({"schema": 1, "deliveries": rows}, indent=1))
        return
    if not rows:
        click.echo("lab: no notification yet")
    for r in rows:
        when = dt.datetime.fromtimestamp(r["created_at"]).strftime("%m-%d %H:%M:%S")
        err = f"  ({r['last_error']})" if r["last_error"] and r["state"] != "sent" else ""
        click.echo(f"{when}  {r['event']:<17} {r['stage'] or '':<10} {r['state']:<7} x{r['attempts']}  "
                   f"{r['url']}{err}")


COMMANDS = [notify]
