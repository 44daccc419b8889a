"""`lab sync HOST`: put the project and its config on a host and make its venv from the lock.

rsync over the very ssh command line the executor uses (same options, same master connection),
then, on the host: create the venv if it is missing and `pip install --no-deps -r LOCK` — the exact
pins, nothing resolved anew. Every remote command is an argv list joined with shlex.quote.

With `--wheelhouse` (a host without a package index) the lock's wheels are downloaded here for the
host's platform (wheelhouse.py), copied along, and installed from them alone: `--no-index
--find-links`, the host's pip configuration not read (its index, find-links or constraints).
"""

from __future__ import annotations

import posixpath
import shlex
import subprocess
from pathlib import Path
from typing import TextIO

from eaglelab.config import REPO_ROOT
from eaglelab.errors import HostError

from ..executors.ssh import SshExecutor
from ..pipeline.preflight import lock_path
from . import wheelhouse as wheels

EXCLUDES = [".git", ".venv", "/logs", "/data", "__pycache__", "*.pyc", ".pytest_cache", ".hypothesis",
            "/tests/output", "*.egg-info", "/build", "/.whl", "/.gl"]
LOCK_ON_HOST = ".eaglelab/requirements.lock"  # under the host's repo_dir
WHEELHOUSE_ON_HOST = ".eaglelab/wheelhouse"  # one folder per lock digest and platform, under repo_dir


def rsync_argv(ex: SshExecutor, src: str, dest: str, excludes: list[str] | None = None) -> list[str]:
    # -s: file names go to the remote rsync as data, never through the remote shell.
    return (["rsync", "-a", "-s", "--mkpath", *[f"--exclude={e}" for e in excludes or []],
             "-e", shlex.join(ex.ssh_argv()), src, f"{ex.ssh.host}:{dest}"])


def venv_dir(python: str) -> str:
    """The venv that holds the host's python (`X/bin/python` -> `X`)."""
    parts = python.rstrip("/").split("/")
    if len(parts) < 3 or parts[-2] != "bin":
        raise HostError(f"python = {python!r}: `lab sync` makes a venv, so python must be VENV/bin/python")
    return "/".join(parts[:-2]) or "/"


def sync(ex: SshExecutor, out: TextIO, timeout_s: float = 3600, wheelhouse: bool = False) -> None:
    host = ex.host
    if host.ssh is None:
        raise HostError(f"host {host.name!r} is reach: {host.reach}; `lab sync` is for ssh hosts")
    repo = ex._rel_repo()  # relative to the remote home, or absolute
    if repo in ("", ".", "/"):
        raise HostError(f"hosts.{host.name}.repo_dir = {host.repo_dir!r}: give the project its own directory "
                        f"on the host (e.g. ~/eaglelab) before `lab sync` copies files into it")
    lock = lock_path(host)
    if not lock.is_file():
        raise HostError(f"hosts.{host.name}.lock: {lock} not found")
    venv = venv_dir(ex.remote_python)
    vpy = posixpath.join(venv, "bin", "python")
    copies = [rsync_argv(ex, f"{REPO_ROOT}/", f"{repo}/", EXCLUDES),
              rsync_argv(ex, str(lock), posixpath.join(repo, LOCK_ON_HOST))]
    install = [vpy, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", *host.pip_options]
    if wheelhouse:
        target = wheels.target_from_facts(wheels.host_facts(ex, vpy), host.name)
        wh = wheels.build(lock, target, ex.logs_dir, out=out, timeout_s=timeout_s)
        print(f"lab sync: {wheels.describe(wh)}", file=out, flush=True)
        on_host = posixpath.join(repo, WHEELHOUSE_ON_HOST, Path(wh["dir"]).name)
        copies.append(rsync_argv(ex, f"{wh['dir']}/", f"{on_host}/"))
        # the wheels alone: no index, and none of the host's pip configuration (an index it cannot
        # reach, other find-links, constraints); the host's pip_options are for installs from an index
        install = ["env", "PIP_CONFIG_FILE=/dev/null", vpy, "-m", "pip", "--isolated", "install", "-q", "--no-deps",
                   "--disable-pip-version-check", "--no-index", "--find-links", on_host]
    print(f"lab sync: {REPO_ROOT} -> {host.name}:{repo}", file=out, flush=True)
    for argv in copies:
        cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
        if cp.returncode != 0:
            raise HostError(f"host {host.name!r}: rsync failed (rc {cp.returncode}): {cp.stderr.strip()[-500:]}")
    steps = [
        # [ -x VENV/bin/python ] || BASE -m venv VENV
        shlex.join(["test", "-x", vpy]) + " || " + shlex.join([host.base_python, "-m", "venv", venv]),
        shlex.join([*install, "-r", posixpath.join(repo, LOCK_ON_HOST)]),
    ]
    print(f"lab sync: venv {venv} from {lock.name} ({host.name})", file=out, flush=True)
    cp = ex.run_ssh(" && ".join(f"( {s} )" for s in steps), timeout=timeout_s)
    if cp.returncode != 0:
        raise HostError(f"host {host.name!r}: making the venv failed (rc {cp.returncode}): "
                        f"{(cp.stderr or b'').decode(errors='replace').strip()[-800:]}")
    print(f"lab sync: {host.name} done", file=out, flush=True)
