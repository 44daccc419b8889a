"""`lab`: the command line. Callbacks parse, call the core (lab.Lab, status.collect), format.

Core commands live here; every other concern adds its commands in eaglelab/control/commands/,
whose module is imported only when one of its commands is named (commands.INDEX).
"""

from __future__ import annotations

import json
import sys
import time

import click

from eaglelab import __version__
from eaglelab.errors import EaglelabError
from eaglelab.model import RunState, exit_text

from . import commands
from .lab import ACTIVE, Lab, exit_code_of


class _Ctx:
    def __init__(self, conf: str | None, profile: str | None):
        self.conf, self.profile, self._lab = conf, profile, None

    @property
    def lab(self) -> Lab:
        if self._lab is None:
            self._lab = Lab.load(self.conf, self.profile)
        return self._lab


pass_ctx = click.make_pass_decorator(_Ctx)


class _LabGroup(click.Group):
    """The core commands defined here, and those of commands/, found by name when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *commands.INDEX})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return super().get_command(ctx, name) or commands.command(name)


@click.group(cls=_LabGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--conf", envvar="EAGLELAB_CONF", metavar="DIR", help="Config directory (default: <repo>/conf).")
@click.option("--profile", envvar="EAGLELAB_PROFILE", help="Profile from conf/profiles/ (default: lab.yaml's).")
@click.version_option(package_name=None, version=__version__)
@click.pass_context
def cli(ctx: click.Context, conf: str | None, profile: str | None) -> None:
    """eaglelab: run, watch and time EAGLE-3 drafter pipelines on the lab's hosts."""
    ctx.obj = _Ctx(conf, profile)


@cli.command()
@click.argument("stages", nargs=-1, required=True)
@click.option("--wait/--detach", default=True, help="Follow until the stage ends (default) or return at once.")
@click.option("--force", is_flag=True, help="Run even if the stage is up to date.")
@click.option("--deps", is_flag=True, help="Also run the jobs it depends on, where needed.")
@click.option("--quiet", "-q", is_flag=True, help="Do not stream the log while waiting.")
@click.option("--ignore-gates", is_flag=True, help="Do not stop a stage whose gate fails while it runs.")
@pass_ctx
def run(c: _Ctx, stages: tuple[str, ...], wait: bool, force: bool, deps: bool, quiet: bool, ignore_gates: bool) -> None:
    """Run STAGES in order; a running stage is attached to, an unchanged completed one skipped."""
    c.lab.ignore_gates = ignore_gates
    for name in stages:
        rec = c.lab.run(name, force=force, deps=deps, wait=wait, follow=not quiet)
        if wait and c.lab.cfg.stage(name).kind == "job" and rec["state"] != RunState.COMPLETED:
            raise click.exceptions.Exit(exit_code_of(rec))


@cli.command()
@click.option("--force", is_flag=True, help="Rerun every stage.")
@click.option("--keep-services", is_flag=True, help="Leave services running at the end.")
@click.option("--quiet", "-q", is_flag=True, help="Do not stream logs.")
@click.option("--notify/--no-notify", default=True, help="Send the pipeline_finished webhook (cron firings send their own).")
@click.option("--ignore-gates", is_flag=True, help="Run the stages whose gate (conf/pipeline.yaml gates:) fails.")
@pass_ctx
def pipeline(c: _Ctx, force: bool, keep_services: bool, quiet: bool, notify: bool, ignore_gates: bool) -> None:
    """Run every job of the pipeline in dependency order (each one only if needed)."""
    lab = c.lab
    lab.ignore_gates = ignore_gates
    # here: every `lab` call imports cli.py, and `lab status --json` has a CPU budget
    from .pipeline.fit import refuse_misfits
    refuse_misfits(lab.cfg)  # a stage over a GPU's memory, a disk or the time budget: refused before launch
    t0 = time.time()
    result = lab.pipeline(force=force, keep_services=keep_services, follow=not quiet, out=sys.stdout)
    if notify:
        # here: every `lab` call imports cli.py, and `lab status --json` has a CPU budget
        from .notify import pipeline_finished
        failed = result.failed
        pipeline_finished(lab.notifier, firing_id=f"manual-{int(t0)}", target="pipeline", ok=failed is None,
                          detail=result.detail, failed_stage=failed["stage"] if failed else None,
                          stages=result.ran, duration_s=time.time() - t0, log=None)
    if result.error is not None:
        raise result.error
    if result.failed:
        click.echo(f"lab: pipeline stopped at {result.failed['stage']} ({result.detail})", err=True)
        raise click.exceptions.Exit(exit_code_of(result.failed))
    click.echo("lab: pipeline complete")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object, schema 1 (docs/interfaces.md).")
@click.option("--no-refresh", is_flag=True, help="Show the registry as it is, without asking the hosts.")
@click.option("--all", "show_all", is_flag=True, help="Every run, not only each stage's latest.")
@pass_ctx
def status(c: _Ctx, as_json: bool, no_refresh: bool, show_all: bool) -> None:
    """Every host and stage: state, progress, ETA."""
    # here: every `lab` call imports cli.py, and `lab status --json` has a CPU budget
    from .status import collect
    st = collect(c.lab, refresh=not no_refresh)
    if as_json:
        click.echo(json.dumps(st.to_json(), indent=1))
        return
    # here: every `lab` call imports cli.py, and `lab status --json` has a CPU budget
    from .render import print_status
    print_status(st, show_all=show_all)


@cli.command()
@click.argument("target")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the run ends.")
@click.option("-n", "--lines", default=40, show_default=True, help="Lines of the end of the log (without -f).")
@pass_ctx
def logs(c: _Ctx, target: str, follow: bool, lines: int) -> None:
    """The log of TARGET (a stage: its latest run; or a run id)."""
    lab = c.lab
    rec = lab.resolve_run(target)
    ex = lab.executor(rec["host"])
    if follow:
        lab.wait(rec, out=sys.stdout)
        return
    size = rec.get("log_size") or 0
    start = max(0, size - 256 * 1024)
    data = ex.read_log(rec["id"], start, 1 << 20).decode("utf-8", "replace")
    # \r frames: show each frame's last state, as a terminal would.
    shown = [ln.rsplit("\r", 1)[-1] for ln in data.replace("\r\n", "\n").split("\n")]
    click.echo("\n".join(shown[-lines - 1:]).rstrip("\n"))


@cli.command()
@click.argument("target")
@click.option("--grace", type=float, default=None, help="Seconds between TERM and KILL (default: the stage's).")
@pass_ctx
def stop(c: _Ctx, target: str, grace: float | None) -> None:
    """Stop TARGET (a stage's running run, or a run id): TERM its process group, then KILL."""
    rec = c.lab.resolve_run(target)
    if rec["state"] not in ACTIVE:
        click.echo(f"lab: {rec['id']} is not running ({rec['state']})")
        return
    t0 = time.time()
    final = c.lab.stop(rec["id"], grace)
    extra = " — processes of its group outlived it (GPU memory may still be held)" if final.get("orphans") else ""
    how = exit_text(final)
    click.echo(f"lab: {final['id']} {final['state']}{f' ({how})' if how else ''} "
               f"after {time.time() - t0:.1f} s{extra}")


def main() -> None:
    try:
        rc = cli.main(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except EaglelabError as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
