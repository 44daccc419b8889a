"""A Slurm cluster: stages are sbatch'ed from a login node and run under jobwrap inside their
allocation, so the run directory (on the cluster's shared work dir), log, state JSON and ETA are
those of every other host; Slurm adds the queue (PENDING + reason, position, start estimate), the
job id, partition and node list, and end states that only it knows (OUT_OF_MEMORY, TIMEOUT,
NODE_FAIL, PREEMPTED ...; the table is eaglelab.host.slurmside.END_STATES).

The login node is this machine (no `ssh:` block: the controller runs there) or reached over ssh
exactly as an ssh host (the `ssh:` block); either way the Slurm side is eaglelab.host.slurmside.
"""

from __future__ import annotations

from eaglelab.config import HostConfig, slurm_options
from eaglelab.errors import HostError
from eaglelab.host import slurmside

from .base import Executor, HostUnreachable
from .local import LocalExecutor
from .ssh import SshExecutor


class SlurmError(HostError):
    """sbatch/scancel refused (bad partition, account, QoS, GRES ...): the message is Slurm's."""


class SlurmExecutor(Executor):
    def __init__(self, host: HostConfig):
        super().__init__(host)
        if host.ssh is not None:
            self.login: Executor = SshExecutor(host)
        else:
            self.login = LocalExecutor(host)
        self.remote = host.ssh is not None

    # paths are the login node's (the work dir is shared with the compute nodes)
    def repo_dir(self) -> str:
        return self.login.repo_dir()

    def host_path(self, p: str) -> str:
        return self.login.host_path(p)

    @property
    def work_dir(self) -> str:
        return self.login.work_dir

    @property
    def python(self) -> str:
        return self.login.python

    def _call(self, verb: str, args: dict, timeout: float | None = None) -> dict:
        if self.remote:
            try:
                return self.login.call(verb, args, timeout)  # type: ignore[attr-defined]
            except HostUnreachable:
                raise
            except HostError as e:
                raise SlurmError(str(e)) from None
        try:
            return slurmside.VERBS[verb](args)
        except slurmside.SlurmCommandError as e:
            raise SlurmError(f"host {self.host.name!r}: {e}") from None

    def launch(self, spec: dict) -> dict:
        opts = spec.get("slurm") or slurm_options(self.host)
        spec = {k: v for k, v in spec.items() if k not in ("inputs", "outputs", "slurm")}
        spec.update(python=spec.get("python") or self.python, cwd=spec.get("cwd") or self.repo_dir())
        return self._call("slurm_submit", {"work_dir": self.work_dir, "spec": spec, "slurm": opts})

    def report(self, stage: str | None = None) -> dict:
        try:
            return self._call("slurm_report", {"work_dir": self.work_dir, "stage": stage})
        except SlurmError as e:
            raise HostUnreachable(str(e)) from None

    def stop(self, run_id: str, grace_s: float = 30.0) -> dict:
        return self._call("slurm_stop", {"work_dir": self.work_dir, "run_id": run_id, "grace_s": grace_s},
                          timeout=grace_s + 60)

    def inputs_digest(self, paths: list[str], cwd: str) -> dict[str, str]:
        return self.login.inputs_digest(paths, cwd)

    def paths_info(self, paths: list[str], cwd: str) -> dict[str, dict]:
        return self.login.paths_info(paths, cwd)

    def manifests(self, paths: list[str], cwd: str) -> dict[str, dict | None]:
        return self.login.manifests(paths, cwd)

    def inside_roots(self, paths: list[str], roots: list[str], cwd: str) -> dict:
        return self.login.inside_roots(paths, roots, cwd)

    def rsync_target(self, path: str) -> tuple[list[str] | None, str]:
        return self.login.rsync_target(path)

    def input_sizes(self, requests: list[dict], cwd: str) -> list[dict]:
        return self.login.input_sizes(requests, cwd)  # the login node sees the shared file system

    def read_log(self, run_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        return self.login.read_log(run_id, offset, limit)

    def ready(self, run_id: str, url: str | None, log_regex: str | None, wait_s: float = 0.0) -> bool:
        # asked on the login node: it shares the work dir (the log) with the compute nodes
        return self.login.ready(run_id, url, log_regex, wait_s)

    # await_change: the base class's sleep. The login node sees the run's files but not its jobwrap
    # (on a compute node), so it cannot tell a live run from a lost one there.

    def try_command(self) -> str:
        return self.login.try_command()

    def facts(self, inputs: list[str], outputs: list[str], cwd: str) -> dict:
        """The login node's facts (python, packages: env parity against the host's lock)."""
        return self.login.facts(inputs, outputs, cwd)

    def slurm_facts(self) -> dict:
        return self._call("slurm_facts", {"work_dir": self.work_dir, "slurm": slurm_options(self.host)})
