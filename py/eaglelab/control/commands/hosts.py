"""Commands for the lab's hosts: `lab preflight STAGE`, `lab sync HOST`, `lab wheelhouse HOST`,
`lab mirror TARGET`."""

from __future__ import annotations

import json
import sys

import click

from eaglelab.errors import HostError

from ..executors.ssh import SshExecutor
from ..pipeline import preflight as preflight_mod
from ..pipeline.preflight import lock_path
from ..transfers import wheelhouse as wheels
from ..transfers.sync import sync as do_sync
from ..transfers.sync import venv_dir


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


def _ssh_executor(lab, host: str, what: str):
    lab.cfg.host(host)  # a clear error for an unknown name
    ex = lab.executor(host)
    if not isinstance(ex, SshExecutor):
        raise HostError(f"host {host!r} is not reached over ssh; {what}")
    return ex


@click.command()
@click.argument("host")
@click.option("--wheelhouse", is_flag=True,
              help="Install from wheels downloaded here for HOST's platform (`lab wheelhouse`), copied along: "
                   "for hosts without a package index.")
@click.pass_context
def sync(ctx: click.Context, host: str, wheelhouse: bool) -> None:
    """Copy the project to HOST (rsync over ssh) and make its venv from the host's lock."""
    do_sync(_ssh_executor(_lab(ctx), host, "`lab sync` copies to ssh hosts only"), out=sys.stdout,
            wheelhouse=wheelhouse)


@click.command("wheelhouse")
@click.argument("host")
@click.option("--platform", "platforms", multiple=True, metavar="TAG",
              help="A wheel platform tag of the host (repeat, most specific first), e.g. manylinux_2_28_x86_64.")
@click.option("--python-version", metavar="X.Y", help="The host's Python version, e.g. 3.12.")
@click.option("--implementation", metavar="IMPL", help="cp (CPython, the default) or pp (PyPy).")
@click.option("--abi", "abis", multiple=True, metavar="ABI", help="The ABI tag (default cpXY), repeatable.")
@click.pass_context
def wheelhouse(ctx: click.Context, host: str, platforms: tuple[str, ...], python_version: str | None,
               implementation: str | None, abis: tuple[str, ...]) -> None:
    """Download HOST's lock as wheels for HOST's platform, on this machine (cached under the logs dir).

    The platform is asked of the host unless --platform and --python-version give it; `lab sync HOST
    --wheelhouse` then copies the wheels there and installs from them alone."""
    lab = _lab(ctx)
    cfg = lab.cfg.host(host)
    lock = lock_path(cfg)
    if not lock.is_file():
        raise HostError(f"hosts.{host}.lock: {lock} not found")
    if bool(platforms) != bool(python_version):
        raise click.UsageError("give --platform and --python-version together (or neither: the host is asked)")
    if platforms:
        target = wheels.target_from_options(platforms, python_version, implementation, abis)
    else:
        ex = _ssh_executor(lab, host, "give its platform with --platform and --python-version")
        target = wheels.target_from_facts(wheels.host_facts(ex, venv_dir(ex.remote_python) + "/bin/python"),
                                         host)
    info = wheels.build(lock, target, lab.cfg.logs_dir, out=sys.stderr)
    click.echo(f"lab {wheels.describe(info)}")
    click.echo(f"lab wheelhouse: for {target.key()} ({' '.join(target.pip_args())}); "
               f"`lab sync {host} --wheelhouse` copies and installs it")


@click.command()
@click.argument("target")
@click.pass_context
def mirror(ctx: click.Context, target: str) -> None:
    """Bring the controller's copy of TARGET's log (logs/mirror/HOST/RUN.log) up to date."""
    lab = _lab(ctx)
    rec = lab.resolve_run(target)
    ex = lab.executor(rec["host"])
    # a Slurm host's log is mirrored from its login node when that is reached over ssh
    mirror_ = getattr(ex, "mirror", None) or getattr(getattr(ex, "login", None), "mirror", None)
    if mirror_ is None:
        where = "Slurm; its login node is this machine" if ex.host.reach == "slurm" else "local"
        click.echo(f"lab: {rec['id']} runs on {rec['host']} ({where}): its log is {rec.get('run_dir')}/output.log")
        return
    size = mirror_.sync(ex, rec["id"])
    click.echo(f"{mirror_.path(rec['host'], rec['id'])} {size} bytes")


COMMANDS = [preflight, sync, wheelhouse, mirror]
