"""`lab cron install|list|remove|fire` and `lab plan`: the pipeline on a schedule, stale stages only.

The logic lives in eaglelab.control.pipeline.cron (the entry, the lock, the summaries) and eaglelab.control.pipeline.plan (the
verdicts); these callbacks parse, call, and print.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import click

from eaglelab import config as config_mod
from eaglelab.errors import EaglelabError
from eaglelab.fsutil import open_private_append, private_dir, utcnow_iso
from eaglelab.model import RunState

from ..lab import exit_code_of
from ..notify import pipeline_finished
from ..pipeline import cron as cronlib
from ..pipeline.fit import format_fit, make_fit_plan, refuse_misfits
from ..pipeline.plan import format_plan, make_plan


def _lab(ctx: click.Context):
    return ctx.find_root().obj.lab  # cli._Ctx, loaded on first use (not imported: cli imports us)


def _check_target(lab, target: str) -> str:
    if target != "pipeline" and lab.cfg.stage(target).kind != "job":  # stage(): an error naming the stages
        raise cronlib.CronError(f"--target {target}: a service runs until stopped; give `pipeline` or a job "
                                f"(jobs start the services they need): "
                                f"{', '.join(n for n, s in lab.cfg.stages.items() if s.kind == 'job')}")
    return target


@click.group("cron")
def cron() -> None:
    """Put the pipeline on the user's crontab; each firing reruns only what is stale."""


@cron.command("install")
@click.option("--schedule", default=cronlib.DEFAULT_SCHEDULE, show_default=True,
              help="When, as 5 cron fields (minute hour day-of-month month day-of-week), in the cron daemon's time zone.")
@click.option("--target", default="pipeline", show_default=True, help="`pipeline`, or one stage (run with its deps).")
@click.pass_context
def install(ctx: click.Context, schedule: str, target: str) -> None:
    """Add (or replace) the crontab entry for TARGET with this conf dir and profile."""
    lab = _lab(ctx)
    _check_target(lab, target)
    entry = cronlib.install(schedule=schedule, target=target, conf_dir=lab.cfg.conf_dir,
                            profile=ctx.find_root().obj.profile, logs_dir=lab.cfg.logs_dir)
    click.echo(f"lab: installed in your crontab ({entry.schedule}):\n  {entry.command}")
    now = dt.datetime.now().astimezone()
    click.echo("lab: next firings: " + ", ".join(t.strftime("%Y-%m-%d %H:%M %Z")
                                                  for t in cronlib.next_times(entry.schedule, now)))
    click.echo(f"lab: each firing logs to {lab.cfg.logs_dir / 'cron'}/<time>-{target}-<id>.log "
               f"(latest.log points at the last one)")


@cron.command("list")
@click.option("--json", "as_json", is_flag=True, help="Entries and recent firings as JSON.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """The eaglelab entries of your crontab, their next firings, and the last firings of this lab."""
    lab = _lab(ctx)
    now = dt.datetime.now().astimezone()
    items = []
    for e in cronlib.entries():
        nxt = cronlib.next_times(e.schedule, now) if e.enabled else []
        items.append({"target": e.target, "conf_dir": e.conf_dir, "schedule": e.schedule, "enabled": e.enabled,
                      "this_conf": e.conf_dir == str(lab.cfg.conf_dir), "command": e.command,
                      "next": [t.isoformat() for t in nxt]})
    recent = cronlib.firings(lab.cfg.logs_dir, limit=5)
    if as_json:
        click.echo(json.dumps({"schema": 1, "entries": items, "firings": recent}, indent=1))
        return
    if not items:
        click.echo("lab: no eaglelab entry in your crontab (add one with `lab cron install`)")
    for it in items:
        mark = "" if it["this_conf"] else f"  (conf {it['conf_dir']})"
        state = "" if it["enabled"] else "  [disabled]"
        click.echo(f"{it['schedule']:<14} {it['target']}{mark}{state}")
        for t in it["next"]:
            click.echo(f"    next: {dt.datetime.fromisoformat(t).strftime('%Y-%m-%d %H:%M %Z')}")
    if recent:
        click.echo("last firings:")
        for f in recent:
            click.echo(f"  {f.get('started_at', '?')}  {f.get('target')}: {f.get('result')}  ({f.get('log')})")


@cron.command("remove")
@click.option("--target", default=None, help="Only this target's entry (default: every target of this conf).")
@click.option("--all", "everything", is_flag=True, help="Every eaglelab entry, whatever its conf dir.")
@click.pass_context
def remove(ctx: click.Context, target: str | None, everything: bool) -> None:
    """Remove the eaglelab entries of this conf dir from your crontab."""
    conf_dir = None if everything else _lab(ctx).cfg.conf_dir
    gone = cronlib.remove(conf_dir=conf_dir, target=target)
    if not gone:
        click.echo("lab: no matching eaglelab entry in your crontab")
    for e in gone:
        click.echo(f"lab: removed {e.schedule} {e.target} ({e.conf_dir})")


@cron.command("fire")
@click.option("--target", default="pipeline", show_default=True, help="`pipeline`, or one stage (with its deps).")
@click.pass_context
def fire(ctx: click.Context, target: str) -> None:
    """What the crontab entry runs: one firing, logged to <logs_dir>/cron/, never two at once."""
    lab = _lab(ctx)
    _check_target(lab, target)
    t0 = time.time()
    cron_dir = private_dir(lab.cfg.logs_dir / "cron")  # firings' logs: what the stages printed, private
    out = cron_dir / "cron.out"  # cron's `>>` made it with cron's umask (0644) before the entry said umask 077
    if out.exists() and out.stat().st_uid == os.getuid():
        out.chmod(0o600)
    firing_id = cronlib.new_firing_id(target, t0)
    log_path = cron_dir / f"{firing_id}.log"
    click.echo(f"{utcnow_iso(t0)} firing {firing_id}: log {log_path}")  # the index line, in cron.out
    _redirect_output(log_path)
    click.echo(f"{utcnow_iso(t0)} eaglelab cron firing {firing_id}: target {target}, pid {os.getpid()}, "
               f"conf {lab.cfg.conf_dir}, profile {lab.cfg.profile}")
    click.echo(f"environment: {' '.join(sorted(os.environ))}")  # what cron gave us (names only)
    lock = cronlib.FiringLock(lab.cfg.logs_dir / "locks")
    if not lock.try_acquire({"firing_id": firing_id, "target": target, "log": str(log_path)}):
        h = lock.holder()
        click.echo(f"{utcnow_iso()} another firing is running ({h.get('firing_id', '?')}, pid {h.get('pid', '?')}, "
                   f"since {h.get('since', '?')}, log {h.get('log', '?')}); this firing exits without touching it")
        raise click.exceptions.Exit(cronlib.BUSY_EXIT)
    cronlib.point_latest(cron_dir, log_path)
    rc, steps, before, error = 1, [], {}, None
    # A firing stopped by SIGTERM (shutdown, a person) still records how far it got.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        steps = make_plan(lab, None if target == "pipeline" else [target])
        click.echo("plan:")
        for line in format_plan(steps):
            click.echo(f"  {line}")
        before = {s.stage: s.latest_run for s in steps}
        rc, error = _run_target(ctx, target)
    except (SystemExit, KeyboardInterrupt) as e:
        rc = e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 130
        error = f"the firing was interrupted (exit {rc}); its stages run on and the next firing attaches"
    finally:
        after = {s.stage: lab.latest(s.stage) for s in steps}
        stages = cronlib.summarize(steps, before, after)
        summary = cronlib.firing_summary(firing_id=firing_id, target=target, started=t0, now=time.time(),
                                         exit_code=rc, error=error, stages=stages, log=str(log_path))
        result, bad = summary["result"], summary["failed_stage"]
        for s in stages:
            click.echo(f"  {s['stage']}: {s['outcome']}" + (f" ({s['run_id']})" if s["run_id"] else ""))
        cronlib.write_summary(cron_dir, summary)
        pipeline_finished(lab.notifier, firing_id=firing_id, target=target, ok=summary["ok"],
                          detail=summary["detail"], failed_stage=bad, stages=stages,
                          duration_s=time.time() - t0, log=str(log_path))
        # The last line: whoever waits on the log knows the summary is written.
        click.echo(f"{utcnow_iso()} firing {firing_id} {result} in {time.time() - t0:.1f} s (exit {rc})")
        cronlib.prune(cron_dir)
        lock.release()
    raise click.exceptions.Exit(rc)


def _run_target(ctx: click.Context, target: str) -> tuple[int, str | None]:
    """The pipeline (or `TARGET --deps`) through the core, as `lab pipeline -q` would; (exit code,
    error). The firing sends its own pipeline_finished."""
    lab = _lab(ctx)
    try:
        if target == "pipeline":
            refuse_misfits(lab.cfg)  # as `lab pipeline`: a plan that does not fit is not started
            result = lab.pipeline(follow=False, out=sys.stdout)
            if result.error is not None:
                raise result.error
            if result.failed:
                click.echo(f"lab: pipeline stopped at {result.failed['stage']} ({result.failed['state']})")
                return exit_code_of(result.failed), None
        else:
            rec = lab.run(target, deps=True, wait=True, follow=False)
            if lab.cfg.stage(target).kind == "job" and rec["state"] != RunState.COMPLETED:
                return exit_code_of(rec), None
        return 0, None
    except EaglelabError as e:
        click.echo(f"lab: {e.format_message()}")
        return e.exit_code, e.format_message()
    except Exception as e:  # noqa: BLE001 - the firing still records and reports how it ended
        traceback.print_exc()
        return 1, f"{type(e).__name__}: {e}"


def _redirect_output(log_path: Path) -> None:
    """From here on, this process's stdout and stderr (and its children's) go to the firing's log."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = open_private_append(log_path)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)


@click.command("plan")
@click.argument("stages", nargs=-1)
@click.option("--force", is_flag=True, help="As `lab pipeline --force` would: every stage runs.")
@click.option("--offline", is_flag=True,
              help="Contact no host: what each stage needs (GPUs, GPU memory, RAM, disk, time) and what does not "
                   "fit, from the model's facts (docs/planning.md).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: {schema, steps: [{stage, action, reason, ...}]}; "
                                                     "with --offline: {schema, plan: {stages, misfits, ...}}.")
@click.pass_context
def plan(ctx: click.Context, stages: tuple[str, ...], force: bool, offline: bool, as_json: bool) -> None:
    """What `lab pipeline` (or a cron firing) would do per stage and why, without doing it."""
    if offline:
        return _offline_plan(ctx, list(stages) or None, as_json)
    lab = _lab(ctx)
    steps = make_plan(lab, list(stages) or None, force=force)
    if as_json:
        click.echo(json.dumps({"schema": 1, "steps": [s.as_dict() for s in steps]}, indent=1))
        return
    for line in format_plan(steps, settings=True):
        click.echo(line)
    n_run = sum(s.action == "run" for s in steps)
    click.echo(f"-- {n_run} to run, {sum(s.action == 'skip' for s in steps)} up to date, "
               f"{sum(s.action == 'attach' for s in steps)} running (the pipeline stops at the first failure)")
    p = make_fit_plan(lab.cfg, list(stages) or None)
    if p is not None and p.misfits:
        click.echo(f"DOES NOT FIT ({len(p.misfits)}; `lab plan --offline` shows every figure):")
        for m in p.misfits:
            click.echo(f"  {m.line()}")


def _offline_plan(ctx: click.Context, stages: list[str] | None, as_json: bool) -> None:
    """The plan that knows what fits, from the config and the model's facts alone."""
    root = ctx.find_root().obj
    cfg = config_mod.load(root.conf, root.profile)
    p = make_fit_plan(cfg, stages)
    if p is None:
        raise click.ClickException(f"no model facts for profile {cfg.profile!r}: neither the model's config.json "
                                   f"here nor {cfg.conf_dir / 'facts' / (cfg.profile + '.yaml')} "
                                   f"(docs/planning.md says what it holds)")
    if as_json:
        click.echo(json.dumps({"schema": 1, "profile": cfg.profile, "plan": p.as_dict()}, indent=1))
    else:
        for line in format_fit(p):
            click.echo(line)
    if p.misfits:
        raise click.exceptions.Exit(1)


COMMANDS = [cron, plan]
