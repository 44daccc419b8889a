"""A host reached over plain ssh: `python -m eaglelab.host.hostside VERB JSON` there, one JSON object back.

Nothing runs on the host but our own package. The system `ssh` is used so that the user's
~/.ssh/config (aliases, keys, ProxyJump) is honoured. Every call:
  - `-T` (never a pty: a pty hangs up the launched job), BatchMode (never a password prompt),
    ConnectTimeout and ServerAlive* from the host's `ssh:` block, so a dead link fails in seconds;
  - one multiplexed connection per host (ControlMaster/ControlPersist, socket under logs/ssh/);
  - the remote command is an argv list joined with shlex.quote: no value from the config or a
    stage argument can become shell syntax on the host.
rc 255 (ssh's own failure) or a timeout -> HostUnreachable; the host's runs keep their last state.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import posixpath
import shlex
import stat as _stat
import subprocess
import sys
import tempfile
from pathlib import Path

from eaglelab.config import REPO_ROOT, HostConfig
from eaglelab.errors import HostError
from eaglelab.fsutil import atomic_write_bytes

from ..transfers.mirror import LogMirror
from .base import Executor, HostUnreachable


def private_dir(d: Path) -> Path:
    """d, made if missing, and only if it is a real directory of ours that nobody else can enter.
    Whoever can write where the ssh master sockets are receives every remote command (stage
    secrets included) and can forge the hosts' answers: a folder someone else made first (in the
    shared temp dir, say), a link, or loose permissions are refused, never used."""
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(d)
    if not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        why = ("is not a directory (a link?)" if not _stat.S_ISDIR(st.st_mode) else
               f"belongs to uid {st.st_uid}, not {os.getuid()}" if st.st_uid != os.getuid() else
               f"has mode {_stat.S_IMODE(st.st_mode):o}, not 700")
        raise HostError(f"{d}: the ssh control sockets' folder {why}; another user could read or forge "
                        f"what the hosts answer. Remove it (or `chmod 700` it if it is yours) and try again")
    return d


SHORT_DIR_NOTE = "ssh-socket-dir"  # in logs/: the short socket folder chosen when the usual one was squatted
SOCKET_MAX = 90  # sun_path is 108 bytes; ssh adds a 17-byte temporary suffix while it binds


def remote_rel(p: str) -> str:
    """A host path as the remote command sees it: `~/x` -> `x` (ssh starts in the home dir), so
    nothing needs the remote shell's tilde expansion and every path can be quoted."""
    if p == "~":
        return "."
    return p[2:] if p.startswith("~/") else p


class SshExecutor(Executor):
    def __init__(self, host: HostConfig, logs_dir: str | os.PathLike | None = None):
        super().__init__(host)
        if host.ssh is None:
            raise HostError(f"host {host.name!r}: reach: ssh needs an `ssh:` block with `host:`")
        if host.ssh.host.startswith("-"):
            raise HostError(f"host {host.name!r}: ssh.host = {host.ssh.host!r} may not start with '-'")
        self.ssh = host.ssh
        self.logs_dir = Path(logs_dir or getattr(host, "_logs_dir", None) or REPO_ROOT / "logs")
        self.mirror = LogMirror(self.logs_dir / "mirror")
        self._home: str | None = None

    # -- paths on the host ---------------------------------------------------------------------

    def _rel_repo(self) -> str:
        return remote_rel(self.host.repo_dir)

    def _join(self, base: str, p: str) -> str:
        """p relative to base; `~/x` stays relative to the home dir (where remote commands start)."""
        if p == "~" or p.startswith(("~/", "/")):
            return remote_rel(p)
        return posixpath.normpath(posixpath.join(base, p))

    def repo_dir(self) -> str:
        """Absolute: stage commands and cwd are resolved by processes that do not start in $HOME."""
        rel = self._rel_repo()
        return rel if rel.startswith("/") else posixpath.normpath(posixpath.join(self.home(), rel))

    def host_path(self, p: str) -> str:
        r = self._join(self.repo_dir(), p)
        return r if r.startswith("/") else posixpath.normpath(posixpath.join(self.home(), r))

    @property
    def work_dir(self) -> str:
        # Relative to $HOME is fine here: hostside resolves it on the host (no home lookup needed).
        return self._join(self._rel_repo(), self.host.work_dir)

    @property
    def remote_python(self) -> str:
        return self._join(self._rel_repo(), self.host.python)

    @property
    def python(self) -> str:
        return self.host_path(self.host.python)

    def home(self) -> str:
        if self._home is None:
            home = self.facts().get("home")
            if not isinstance(home, str) or not home.startswith("/"):
                raise HostError(f"host {self.host.name!r}: its facts answer has no home directory (home: {home!r}), "
                                f"so no path there can be made absolute; its eaglelab is older than this one or "
                                f"broken: run `lab sync {self.host.name}`")
            self._home = home
        return self._home

    # -- the ssh command line ------------------------------------------------------------------

    def control_path(self) -> str:
        """One socket per (destination, options, lab): test labs with equal addresses never share."""
        key = json.dumps([self.ssh.host, self.ssh.user, self.ssh.port, self.ssh.config_file, self.ssh.options,
                          str(self.logs_dir)])
        name = hashlib.sha256(key.encode()).hexdigest()[:20]
        d = self.logs_dir / "ssh"
        if len(str(d / name)) > SOCKET_MAX:  # too long for a socket: a short private folder instead
            return str(self._short_private_dir() / name)
        return str(private_dir(d) / name)

    def _short_private_dir(self) -> Path:
        """The usual short folder ($XDG_RUNTIME_DIR/eaglelab-ssh, else /tmp/eaglelab-ssh-UID); when
        another user squatted it (made it first, a link, loose modes), a folder of a random name made
        here (0700, ours by construction), remembered in logs/ so the next `lab` shares its masters:
        a squatter costs the shared name, never every host."""
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        base = Path(runtime) if runtime else Path(tempfile.gettempdir())
        usual = base / ("eaglelab-ssh" if runtime else f"eaglelab-ssh-{os.getuid()}")
        try:
            return private_dir(usual)
        except (HostError, OSError) as e:
            squatted = str(e)
        note = self.logs_dir / SHORT_DIR_NOTE
        try:
            chosen = Path(note.read_text().strip())
            if chosen.parent == base and chosen.name.startswith(f"eaglelab-ssh-{os.getuid()}-"):
                return private_dir(chosen)
        except (OSError, HostError):
            pass  # none yet, or it was squatted or cleaned away too: a new one
        chosen = Path(tempfile.mkdtemp(prefix=f"eaglelab-ssh-{os.getuid()}-", dir=base))
        try:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(note, str(chosen).encode() + b"\n")
        except (OSError, HostError):
            pass  # not remembered: this process still works, the next one makes its own
        print(f"lab: not using {usual} for the ssh sockets ({squatted.split('; ')[0]}); using {chosen}, private",
              file=sys.stderr, flush=True)
        return chosen

    def ssh_argv(self, multiplex: bool | None = None) -> list[str]:
        """`ssh` and its options, up to (not including) the destination."""
        s = self.ssh
        argv = ["ssh", "-T", "-x", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={s.connect_timeout_s}",
                "-o", f"ServerAliveInterval={s.alive_interval_s}", "-o", f"ServerAliveCountMax={s.alive_count_max}"]
        if s.multiplex if multiplex is None else multiplex:
            # quoted: a space in the logs path must not split the option (ssh reads -o like a config line)
            argv += ["-o", "ControlMaster=auto", "-o", f'ControlPath="{self.control_path().replace("%", "%%")}"',
                     "-o", f"ControlPersist={s.control_persist_s}"]
        else:
            argv += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        if s.config_file:
            argv += ["-F", str(Path(s.config_file).expanduser())]
        if s.port:
            argv += ["-p", str(s.port)]
        if s.user:
            argv += ["-l", s.user]
        for opt in s.options:
            argv += ["-o", opt]
        return argv

    def try_command(self) -> str:
        """The ssh line a person can paste to try the link: the same config file, port and user."""
        s = self.ssh
        argv = ["ssh"] + (["-F", str(Path(s.config_file).expanduser())] if s.config_file else []) \
            + (["-p", str(s.port)] if s.port else []) + (["-l", s.user] if s.user else []) + [s.host, "true"]
        return shlex.join(argv)

    def remote_command(self, verb: str) -> str:
        """The one string ssh hands to the remote shell, built from an argv list and quoted. The
        arguments go on stdin (`-`): a launch's env may hold secrets, and command lines are public."""
        pythonpath = self._join(self._rel_repo(), "py")
        return shlex.join(["env", f"PYTHONPATH={pythonpath}", self.remote_python, "-m", "eaglelab.host.hostside",
                           verb, "-"])

    def run_ssh(self, remote: str, timeout: float | None = None,
                multiplex: bool | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        """Run one remote command string; HostUnreachable on rc 255 or timeout."""
        argv = self.ssh_argv(multiplex) + ["--", self.ssh.host, remote]
        timeout = timeout or self.ssh.command_timeout_s
        # stderr goes to a file, not a pipe: a ProxyCommand started by the master keeps the
        # first caller's stderr open for as long as the master lives, and a pipe would never end.
        with tempfile.TemporaryFile() as err:
            try:
                cp = subprocess.run(argv, input=stdin if stdin is not None else b"", stdout=subprocess.PIPE,
                                    stderr=err, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise HostUnreachable(f"host {self.host.name!r} ({self.ssh.host}): no answer over ssh within "
                                      f"{timeout:.0f} s; its runs keep their last known state") from None
            err.seek(0)
            cp.stderr = err.read()
        if cp.returncode == 255:
            msg = cp.stderr.decode(errors="replace").strip().splitlines()
            raise HostUnreachable(f"host {self.host.name!r} ({self.ssh.host}): ssh failed: "
                                  f"{msg[-1] if msg else 'exit 255'}; check the link and `{self.try_command()}`")
        return cp

    def call(self, verb: str, args: dict, timeout: float | None = None) -> dict:
        cp = self.run_ssh(self.remote_command(verb), timeout, stdin=json.dumps(args).encode())
        out = cp.stdout.decode(errors="replace").strip()
        try:
            result = json.loads(out.splitlines()[-1]) if out else None
        except ValueError:
            result = None
        if cp.returncode in (126, 127) or (result is None and b"No module named" in cp.stderr):
            raise HostError(f"host {self.host.name!r}: cannot run {self.remote_python!r} -m eaglelab.host.hostside "
                            f"there ({cp.stderr.decode(errors='replace').strip()[-300:]}); "
                            f"run `lab sync {self.host.name}` to install the project and its venv")
        if not isinstance(result, dict):
            raise HostError(f"host {self.host.name!r}: hostside {verb} answered rc {cp.returncode} with "
                            f"{out[:200]!r} {cp.stderr.decode(errors='replace').strip()[-300:]!r}")
        if "error" in result and cp.returncode != 0:
            raise HostError(f"host {self.host.name!r}: hostside {verb} failed: {result['error']}")
        return result

    # -- the executor interface ----------------------------------------------------------------

    def facts(self, inputs: list[str] | None = None, outputs: list[str] | None = None, cwd: str | None = None) -> dict:
        f = self.call("facts", {"work_dir": self.work_dir, "inputs": inputs or [], "outputs": outputs or [],
                                "cwd": cwd or self._rel_repo()})
        self._home = f.get("home") or self._home
        return f

    def ready(self, run_id: str, url: str | None, log_regex: str | None, wait_s: float = 0.0) -> bool:
        return bool(self.call("ready", {"work_dir": self.work_dir, "run_id": run_id, "url": url,
                                        "log_regex": log_regex, "wait_s": wait_s},
                              timeout=wait_s + self.ssh.command_timeout_s).get("ready"))

    def await_change(self, run_id: str, timeout_s: float, log_offset: int | None = None) -> str | None:
        return self.call("await_change", {"work_dir": self.work_dir, "run_id": run_id, "timeout_s": timeout_s,
                                          "log_offset": log_offset},
                         timeout=timeout_s + self.ssh.command_timeout_s).get("changed")

    def inputs_digest(self, paths: list[str], cwd: str) -> dict[str, str]:
        return self.call("inputs_digest", {"paths": paths, "cwd": cwd})

    def paths_info(self, paths: list[str], cwd: str) -> dict[str, dict]:
        return self.call("paths_info", {"paths": paths, "cwd": cwd}, timeout=max(self.ssh.command_timeout_s, 600))

    def manifests(self, paths: list[str], cwd: str) -> dict[str, dict | None]:
        return self.call("manifests", {"paths": paths, "cwd": cwd})

    def inside_roots(self, paths: list[str], roots: list[str], cwd: str) -> dict:
        return self.call("inside_roots", {"paths": paths, "roots": roots, "cwd": cwd})

    def rsync_target(self, path: str) -> tuple[list[str] | None, str]:
        return self.ssh_argv(), f"{self.ssh.host}:{self.host_path(path)}"

    def input_sizes(self, requests: list[dict], cwd: str) -> list[dict]:
        return list(self.call("input_sizes", {"requests": requests, "cwd": cwd}).get("sizes") or [])

    def launch(self, spec: dict) -> dict:
        spec = {**spec, "python": spec.get("python") or self.python, "cwd": spec.get("cwd") or self.repo_dir()}
        spec.pop("inputs", None)  # the outputs go: meta.json records them (their manifests can prove the end)
        return self.call("launch", {"work_dir": self.work_dir, "spec": spec})

    def report(self, stage: str | None = None) -> dict:
        try:
            return self.call("report", {"work_dir": self.work_dir, "stage": stage})
        except HostUnreachable:
            raise
        except HostError as e:
            # A host that answers but cannot run our package (not synced yet, venv gone) is not
            # usable: status shows it unreachable with the reason, and the other hosts still report.
            raise HostUnreachable(str(e)) from None

    def stop(self, run_id: str, grace_s: float = 30.0) -> dict:
        return self.call("stop", {"work_dir": self.work_dir, "run_id": run_id, "grace_s": grace_s},
                         timeout=grace_s + 15 + self.ssh.command_timeout_s)

    def read_log(self, run_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        res = self.call("read_log", {"work_dir": self.work_dir, "run_id": run_id, "offset": offset, "limit": limit})
        data = base64.b64decode(res.get("data", ""))
        # Every read that continues the controller's copy extends it (logs -f mirrors as it streams).
        self.mirror.offer(self.host.name, run_id, offset, data)
        return data

    def close(self) -> None:
        """Ask this host's master connection to exit (tests, benchmarks; users let it persist)."""
        if self.ssh.multiplex:
            subprocess.run(self.ssh_argv() + ["-O", "exit", "--", self.ssh.host], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
