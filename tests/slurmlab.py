"""A real single-node Slurm on this machine: munged + slurmctld + slurmd, all under one temp dir.

    cl = SlurmLab(tmp_path, gpus=2).start()   # cl.env has SLURM_CONF; cl.partition == "debug"
    cl.kill_slurmd(); cl.start_slurmd()        # a node failure, and back
    cl.kill_slurmctld(); cl.start_slurmctld()  # the controller dies and comes back (state kept)
    cl.stop()                                  # every daemon and every job process, by pid

Isolation from whatever else runs here (../shared/docs/testlab.md, measured on this machine kind):
- munged with its own key, socket and pid file (AuthInfo=socket=... points Slurm at it), never
  the system's /run/munge;
- every Slurm path (state, spool, pid, log, jobcomp) under the temp dir, ports picked free on
  127.0.0.1, the node named after the lab (`slurmd -N`), the client commands pointed at the conf
  by SLURM_CONF only (the environment of the caller, never /etc/slurm);
- no cgroups (22.05 has no CgroupPlugin=disabled: cgroup.conf must be absent): proctrack/linuxproc,
  and memory enforced by jobacct_gather/linux with OverMemoryKill (sampled every second);
- fake GPUs: gres.conf with AutoDetect=off over empty files (slurmd registers gpu:N; CUDA_VISIBLE_DEVICES
  stays empty, so tests check allocations through Slurm);
- daemons run in the foreground (-D) as our children in sessions of their own, killed by pid.
Needs root and the Debian packages slurm-wlm and munge (bin/setup-system installs them).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/mungekey", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmLab:
    __test__ = False

    def __init__(self, root: str | os.PathLike, gpus: int = 2, cpus: int = 4, mem_mb: int = 4000,
                 partition: str = "debug"):
        self.root = Path(root)
        self.name = f"el{secrets.token_hex(3)}"  # node and cluster name, unique per lab
        self.gpus, self.cpus, self.mem_mb, self.partition = gpus, cpus, mem_mb, partition
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.jobcomp = self.root / "log" / "jobcomp.txt"
        self.procs: dict[str, subprocess.Popen] = {}
        self.ctld_port, self.slurmd_port = free_port(), free_port()

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- setup --------------------------------------------------------------------------------

    def write_conf(self) -> None:
        for d in ("etc", "state", "spool", "run", "log", "munge", "gpus"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for i in range(self.gpus):
            (self.root / "gpus" / f"nvidia{i}").touch()
        r = self.root
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        self.conf.write_text(f"""\
ClusterName={self.name}
SlurmctldHost={socket.gethostname().split(".")[0]}(127.0.0.1)
MailProg=/bin/true
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp}
AccountingStorageType=accounting_storage/none
GresTypes=gpu
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
KillWait=5
InactiveLimit=0
MinJobAge=600
OverTimeLimit=0
SchedulerParameters=bf_interval=1,sched_interval=1
PreemptMode=off
NodeName={self.name} NodeAddr=127.0.0.1 NodeHostname={self.name} CPUs={self.cpus} RealMemory={self.mem_mb}{gres} State=UNKNOWN
PartitionName={self.partition} Nodes={self.name} Default=YES MaxTime=INFINITE State=UP
""")
        (self.conf.parent / "gres.conf").write_text(
            "AutoDetect=off\n" + (f"NodeName={self.name} Name=gpu File={r}/gpus/nvidia[0-{self.gpus - 1}]\n"
                                  if self.gpus else ""))

    def start(self) -> SlurmLab:
        missing = [d for d in DAEMONS if not os.path.exists(d)]
        if os.geteuid() != 0 or missing:
            raise RuntimeError(f"the Slurm test lab needs root and {', '.join(missing) or 'its tools'}; "
                               f"run bin/setup-system as root (it installs slurm-wlm and munge)")
        self.write_conf()
        self.start_munged()
        self.start_slurmctld()
        self.start_slurmd()
        self.wait_node_idle()
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "ab")
        self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True, cwd=self.root)

    def start_munged(self) -> None:
        key = self.root / "munge" / "munge.key"
        subprocess.run(["/usr/sbin/mungekey", "--create", "--keyfile", str(key), "--force"], check=True,
                       capture_output=True)
        os.chmod(key, 0o600)
        os.chmod(self.root / "munge", 0o711)  # clients need x on the socket dir
        self._spawn("munged", ["/usr/sbin/munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={self.root}/munge/munged.pid",
                               f"--log-file={self.root}/log/munged.log", f"--seed-file={self.root}/munge/seed"])
        self._wait(lambda: self.munge_socket.exists(), 20, "munged did not create its socket")

    def start_slurmctld(self) -> None:
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.scontrol("ping").returncode == 0 and "UP" in self.scontrol("ping").stdout, 60,
                   "slurmctld did not answer `scontrol ping`")

    def start_slurmd(self) -> None:
        self._spawn("slurmd", ["/usr/sbin/slurmd", "-D", "-N", self.name, "-f", str(self.conf)])

    def wait_node_idle(self, timeout: float = 60) -> None:
        def idle():
            out = self.run("sinfo", "-h", "-N", "-o", "%t").stdout.strip()
            if out in ("down", "down*", "drain", "drng"):  # back after a failure: resume it
                self.scontrol("update", f"nodename={self.name}", "state=resume")
            return out in ("idle", "mix", "alloc")
        self._wait(idle, timeout, "the node did not become idle")

    def _wait(self, pred, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting: {what}; logs: {self.logs_tail()}")
            try:
                if pred():
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{what} within {timeout:.0f} s; logs: {self.logs_tail()}")

    def logs_tail(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            try:
                out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:]))
            except OSError:
                pass
        return "\n".join(out)

    # -- commands -----------------------------------------------------------------------------

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout)

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("scontrol", *args)

    def job(self, job_id: str | int) -> dict[str, str]:
        """`scontrol show job -o` as a dict (the test's own check through Slurm)."""
        out = self.scontrol("-o", "show", "job", str(job_id)).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    # -- failures -----------------------------------------------------------------------------

    def _kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs.pop(name, None)
        if p is not None and p.poll() is None:
            os.kill(p.pid, sig)
            p.wait(timeout=30)

    def kill_slurmd(self) -> None:
        self._kill("slurmd")

    def kill_slurmctld(self, sig: int = signal.SIGKILL) -> None:
        self._kill("slurmctld", sig)

    # -- teardown -----------------------------------------------------------------------------

    def job_pids(self) -> list[int]:
        """Processes that run jobs of this lab: slurmstepd and its children, found by our spool dir
        or our conf in their command line / environment (the pid namespace is shared)."""
        mine = [str(self.root).encode()]
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                blob = (d / "cmdline").read_bytes() + (d / "environ").read_bytes()
            except OSError:
                continue
            if any(m in blob for m in mine):
                pids.append(int(d.name))
        return pids

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            self._kill(name, signal.SIGTERM if name == "munged" else signal.SIGKILL)
        for _ in range(3):  # stepd and the jobs it ran (also those of a killed slurmd)
            pids = self.job_pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.3)


def install_hint() -> str:
    return "bin/setup-system (as root) installs slurm-wlm and munge"


if __name__ == "__main__":  # a manual check: python tests/slurmlab.py
    import tempfile
    d = tempfile.mkdtemp(prefix="slurmlab-")
    cl = SlurmLab(d).start()
    try:
        print(cl.run("sinfo").stdout)
        print(cl.run("scontrol", "show", "node").stdout)
    finally:
        cl.stop()
        shutil.rmtree(d, ignore_errors=True)
