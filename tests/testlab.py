"""A real lab on one machine: hosts as network namespaces, each with its own sshd.

    lab = TestLab(tmp_path, hosts=3).start()   # h1 h2 h3 at 10.77.0.11-13, reachable as `ssh -F lab.ssh_config h1`
    lab.cut("h2"); lab.restore("h2")           # pull a host's cable and plug it back
    lab.stop()                                 # kills every process inside, deletes the namespaces

Facts this relies on (../shared/docs/testlab.md, measured on the CI kind of machine):
- the guard route `unreachable 10.77.0.0/24` goes in FIRST, so no test packet can leave the machine;
- the addresses exist only inside namespaces: a controller namespace holds a bridge, each host a
  veth into it; the root namespace reaches them through a ProxyCommand relay run in the controller
  namespace (there is no nc/socat);
- each host has its own hostname (UTS namespace) and its own home: its sshd runs in a private mount
  namespace where /etc/passwd names a per-host home directory (the rest of the filesystem, the
  repository and its venv included, is shared — so the hosts use the controller's venv python);
- each host's /etc/hosts names it (and the others), and its resolv.conf points at its own loopback:
  no lookup asks the machine's nameserver, unreachable from a namespace (each vLLM start waited
  120 s on it);
- `ip netns del` does not kill processes: every pid of `ip netns pids` is killed first;
- `ip netns add` once failed in CI with the xdist workers building labs side by side (exit 1, its
  stderr unrecorded): namespaces are made and deleted under one machine-wide lock, a failed add is
  cleaned up and tried again, and every failing command's error carries its stderr.
Needs root, iproute2 and openssh-server (bin/setup-system installs them).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

SUBNET = "10.77.0.0/24"
GATEWAY = "10.77.0.1"

RELAY = '''\
import os, select, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.settimeout(None)
inp = True
while True:
    r, _, _ = select.select([0, s] if inp else [s], [], [])
    if 0 in r:
        data = os.read(0, 65536)
        if data:
            s.sendall(data)
        else:
            inp = False
            s.shutdown(socket.SHUT_WR)
    if s in r:
        data = s.recv(65536)
        if not data:
            break
        os.write(1, data)
'''


NETNS_LOCK = Path("/run/lock/eaglelab-testlab-netns.lock")


class CommandFailed(subprocess.CalledProcessError):
    """A CalledProcessError whose message says what the command wrote to stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()} stderr: {(self.stderr or '').strip()[-2000:]!r}"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode:
        raise CommandFailed(done.returncode, argv, done.stdout, done.stderr)
    return done


@contextlib.contextmanager
def netns_lock():
    """One namespace change at a time on this machine, across pytest's worker processes."""
    NETNS_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(NETNS_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def add_netns(name: str, attempts: int = 3) -> None:
    """`ip netns add`, under the lock; a failed add leaves its half-made file, deleted before a retry."""
    if (Path("/run/netns") / name).exists():  # someone else's: never delete it on their behalf
        raise FileExistsError(f"network namespace {name} exists already (`ip netns list`)")
    for attempt in range(1, attempts + 1):
        with netns_lock():
            done = sh("ip", "netns", "add", name, check=False)
            if not done.returncode:
                return
            sh("ip", "netns", "del", name, check=False)
        if attempt == attempts:
            raise CommandFailed(done.returncode, ("ip", "netns", "add", name), done.stdout, done.stderr)
        time.sleep(0.2 * attempt)


def require_root_tools() -> None:
    missing = [t for t in ("ip", "unshare", "ssh", "ssh-keygen", "/usr/sbin/sshd") if not shutil.which(t)]
    if os.geteuid() != 0 or missing:
        raise RuntimeError(f"the ssh test lab needs root and {', '.join(missing) or 'its tools'}; "
                           f"run `make setup` as root (bin/setup-system installs openssh-server, iproute2)")


class TestLab:
    __test__ = False  # not a pytest class

    def __init__(self, root: str | os.PathLike, hosts: int = 3):
        self.root = Path(root)
        self.prefix = f"el{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.ctl = f"{self.prefix}-ctl"
        self.hosts = {f"h{i}": f"10.77.0.{10 + i}" for i in range(1, hosts + 1)}
        self.ssh_config = self.root / "ssh_config"
        self.key = self.root / "id_ed25519"
        self.sshd: dict[str, subprocess.Popen] = {}
        self._made: list[str] = []

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def home(self, host: str) -> Path:
        return self.root / host / "home"

    # -- up ------------------------------------------------------------------------------------

    def start(self) -> TestLab:
        require_root_tools()
        sh("ip", "route", "replace", "unreachable", SUBNET)  # the guard, before anything else
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._network()
            self._keys()
            for h in self.hosts:
                self._start_sshd(h)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        add_netns(self.ctl)
        self._made.append(self.ctl)
        for cmd in (["link", "set", "lo", "up"], ["link", "add", "br0", "type", "bridge"],
                    ["addr", "add", f"{GATEWAY}/24", "dev", "br0"], ["link", "set", "br0", "up"]):
            sh("ip", "-n", self.ctl, *cmd)
        for i, (h, addr) in enumerate(self.hosts.items(), 1):
            ns = self.ns(h)
            add_netns(ns)
            self._made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", self.ctl, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", self.ctl, "link", "set", f"v{i}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "route", "replace", "default", "via", GATEWAY)

    def _keys(self) -> None:
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "eaglelab-testlab", "-f", str(self.key))
        (self.root / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        relay = self.root / "relay.py"
        relay.write_text(RELAY)
        python = getattr(sys, "_base_executable", None) or sys.executable
        lines = []
        for h, addr in self.hosts.items():
            lines += [f"Host {h}", f"  HostName {addr}", "  User root", f"  IdentityFile {self.key}",
                      "  IdentitiesOnly yes", "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null",
                      "  LogLevel ERROR",
                      f"  ProxyCommand ip netns exec {self.ctl} {python} -I -S {relay} %h %p", ""]
        self.ssh_config.write_text("\n".join(lines))

    def _start_sshd(self, h: str) -> None:
        d = self.root / h
        self.home(h).mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "hostkey"))
        # root's home is this host's own directory; everything else of /etc/passwd is the machine's.
        passwd = []
        for line in Path("/etc/passwd").read_text().splitlines():
            f = line.split(":")
            if f[0] == "root" and len(f) == 7:
                f[5] = str(self.home(h))
            passwd.append(":".join(f))
        (d / "passwd").write_text("\n".join(passwd) + "\n")
        (d / "sshd_config").write_text("\n".join([
            f"ListenAddress {self.hosts[h]}:22", f"HostKey {d / 'hostkey'}", f"PidFile {d / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "StrictModes no", "UsePAM no",
            "MaxStartups 50:30:100", "MaxSessions 50", "PrintMotd no", "LogLevel ERROR", ""]))
        # Its own /etc/hosts, as a real host has: its name resolves without DNS. And a resolver on its
        # own loopback, where nothing listens: a name not in /etc/hosts fails at once. Before, every
        # lookup (torch's gloo does one in each vLLM start) went to the machine's nameserver, which
        # is no address of the test lab and unreachable from here, and waited 120 s for the timeout.
        names = ["127.0.0.1 localhost", "::1 localhost", f"127.0.1.1 {h}"]
        names += [f"{a} {o}" for o, a in self.hosts.items() if o != h]
        (d / "hosts").write_text("\n".join(names) + "\n")
        (d / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        script = ('hostname "$1" && mount --bind "$2" /etc/passwd && mount --bind "$5" /etc/hosts && '
                  'mount --bind "$6" /etc/resolv.conf && exec /usr/sbin/sshd -D -f "$3" -E "$4"')
        self.sshd[h] = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(h), "unshare", "--uts", "--mount", "--propagation", "private",
             "sh", "-c", script, "sshd-start", h, str(d / "passwd"), str(d / "sshd_config"), str(d / "sshd.log"),
             str(d / "hosts"), str(d / "resolv.conf")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(d / "sshd.err", "ab"))

    def ssh(self, host: str, *remote: str, timeout: float = 20) -> subprocess.CompletedProcess:
        """A plain, unmultiplexed ssh call (for the tests' own look at a host)."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), "-T", "-o", "BatchMode=yes",
                               "-o", "ConnectTimeout=3", host, *remote],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)

    def _wait_ready(self, timeout: float = 20) -> None:
        for h in self.hosts:
            deadline = time.time() + timeout
            while True:
                if self.sshd[h].poll() is not None:
                    raise RuntimeError(f"sshd of {h} exited: {(self.root / h / 'sshd.err').read_text()[-500:]}")
                if self.ssh(h, "hostname").stdout.strip() == h.encode():
                    break
                if time.time() > deadline:
                    raise RuntimeError(f"sshd of {h} did not answer within {timeout} s")
                time.sleep(0.2)

    # -- faults --------------------------------------------------------------------------------

    def cut(self, host: str) -> None:
        sh("ip", "-n", self.ns(host), "link", "set", "eth0", "down")

    def restore(self, host: str) -> None:
        sh("ip", "-n", self.ns(host), "link", "set", "eth0", "up")
        sh("ip", "-n", self.ns(host), "route", "replace", "default", "via", GATEWAY)  # `up` does not bring it back

    # -- down ----------------------------------------------------------------------------------

    def stop(self) -> None:
        for ns in reversed(self._made):
            for _ in range(3):  # a dying process may fork once more; look again
                pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                time.sleep(0.05)
            with netns_lock():
                sh("ip", "netns", "del", ns, check=False)
        self._made.clear()
        for p in self.sshd.values():
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> TestLab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def lab_conf(conf_dir: Path, lab: TestLab, stages: dict, *, work: str = "~/work", hosts: list[str] | None = None,
             names: dict[str, str] | None = None, vars: dict | None = None, lock: str | None = None,
             extra_host: dict | None = None, logs_dir: Path | None = None) -> Path:
    """Write conf/lab.yaml + pipeline.yaml for these test hosts (the repo and python are shared).
    names maps a test host (h1) to the name it has in the config (any string, even hostile)."""
    import yaml
    repo = Path(__file__).resolve().parents[1]
    conf_dir.mkdir(parents=True, exist_ok=True)
    names = names or {}
    host_cfg = {}
    for h in hosts or list(lab.hosts):
        host_cfg[names.get(h, h)] = {
            "reach": "ssh", "repo_dir": str(repo), "python": sys.executable, "work_dir": work,
            "ssh": {"host": h, "config_file": str(lab.ssh_config), "connect_timeout_s": 2,
                    "alive_interval_s": 1, "alive_count_max": 2, "command_timeout_s": 30},
            **({"lock": lock} if lock else {}), **(extra_host or {})}
    (conf_dir / "lab.yaml").write_text(yaml.safe_dump({
        "profile": "none", "logs_dir": str(logs_dir or conf_dir.parent / "logs"), "hosts": host_cfg}))
    (conf_dir / "pipeline.yaml").write_text(yaml.safe_dump({"vars": vars or {}, "stages": stages}))
    return conf_dir


class SshLab:
    """One test's lab config over the shared namespace hosts: its own conf, registry, mirror and
    per-host work dir (`~/work/<test>`, so each host's runs are under its own home)."""

    __test__ = False

    def __init__(self, net: TestLab, root: Path):
        self.net, self.root = net, Path(root)
        self.conf, self.logs = self.root / "conf", self.root / "logs"
        self.work = f"~/work/{self.root.name}"
        self.names: dict[str, str] = {}
        self._labs: list = []

    def write(self, stages: dict, **kw) -> SshLab:
        self.names = kw.get("names") or {}
        lab_conf(self.conf, self.net, stages, work=self.work, logs_dir=self.logs, **kw)
        return self

    def env(self) -> dict:
        repo = Path(__file__).resolve().parents[1]
        env = dict(os.environ, EAGLELAB_CONF=str(self.conf))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo / "py"), str(repo), env.get("PYTHONPATH")]))
        env.pop("EAGLELAB_PROFILE", None)
        return env

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "eaglelab.control.cli", *args]

    def lab(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        p = subprocess.run(self.argv(*args), capture_output=True, text=True, env=self.env(), timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise AssertionError(f"lab {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def popen(self, *args: str, env_extra: dict | None = None, **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(*args), env={**self.env(), **(env_extra or {})},
                                stdin=subprocess.DEVNULL, **kw)

    def status(self) -> dict:
        import json
        return json.loads(self.lab("status", "--json").stdout)

    def core(self):
        """An in-process Lab on this config (its executors are closed at teardown)."""
        from eaglelab.control.lab import Lab
        lab = Lab.load(str(self.conf))
        self._labs.append(lab)
        return lab

    def run_dir(self, host: str, run_id: str) -> Path:
        """A run's directory, read straight from the host's home (the filesystem is shared)."""
        return self.net.home(host) / self.work[2:] / "runs" / run_id

    def cleanup(self) -> None:
        import json
        for h in self.net.hosts:
            runs = self.net.home(h) / self.work[2:] / "runs"
            for d in runs.iterdir() if runs.is_dir() else []:
                if not (d / "exit.json").exists():
                    try:
                        pgid = json.loads((d / "meta.json").read_text()).get("pgid")
                        os.killpg(pgid, signal.SIGKILL)
                    except (OSError, ValueError, TypeError):
                        pass
        # the master connections (also those `lab` subprocesses started): same config, same sockets
        if (self.conf / "lab.yaml").exists():
            self._labs.append(self.core())
        for lab in self._labs:
            for name in lab.cfg.hosts:
                close = getattr(lab.executor(name), "close", None)
                if close:
                    try:
                        close()
                    except Exception:  # noqa: BLE001 - teardown goes on whatever one close does
                        pass
