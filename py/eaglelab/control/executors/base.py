"""The executor interface: launch, report, stop, read_log — the same for every way to reach a host."""

from __future__ import annotations

import abc
import time
from pathlib import Path

from eaglelab.config import REPO_ROOT, HostConfig
from eaglelab.errors import HostError
from eaglelab.host import machine


class HostUnreachable(HostError):
    """The host did not answer (timeout, refused, link down). Its runs keep their last known state."""


class Executor(abc.ABC):
    def __init__(self, host: HostConfig):
        self.host = host

    # Paths on the host. Relative ones are relative to the host's repo_dir.
    def host_path(self, p: str) -> str:
        base = self.repo_dir()
        return p if p.startswith(("/", "~")) else str(Path(base) / p)

    def repo_dir(self) -> str:
        return self.host.repo_dir

    @property
    def work_dir(self) -> str:
        return self.host_path(self.host.work_dir)

    @property
    def python(self) -> str:
        return self.host_path(self.host.python)

    def try_command(self) -> str:
        """A command a person can paste to try reaching the host (fix hints)."""
        return "true"

    @abc.abstractmethod
    def launch(self, spec: dict) -> dict:
        """Start spec (stage, command, cwd, env, ...) under jobwrap, detached; the run's meta."""

    @abc.abstractmethod
    def report(self, stage: str | None = None) -> dict:
        """{"runs": [...], "gpus": ..., "free_disk_bytes": ...}; raises HostUnreachable."""

    @abc.abstractmethod
    def stop(self, run_id: str, grace_s: float = 30.0) -> dict:
        """TERM then KILL the run's process group; the run as it ended."""

    @abc.abstractmethod
    def facts(self, inputs: list[str], outputs: list[str], cwd: str) -> dict:
        """eaglelab.host.hostfacts.facts, gathered on the host in one call: python, packages, free
        disk at the outputs, GPUs, the inputs' digests (preflight's evidence)."""

    @abc.abstractmethod
    def inputs_digest(self, paths: list[str], cwd: str) -> dict[str, str]:
        """hostside.inputs_digest, computed on the host."""

    @abc.abstractmethod
    def paths_info(self, paths: list[str], cwd: str) -> dict[str, dict]:
        """machine.paths_info, computed on the host (what a transfer moves and checks)."""

    def manifests(self, paths: list[str], cwd: str) -> dict[str, dict | None]:
        """machine.read_manifests on the host: the outputs' manifests where they were written."""
        return machine.read_manifests(paths, cwd)

    def inside_roots(self, paths: list[str], roots: list[str], cwd: str) -> dict:
        """machine.inside_roots on the host: the paths and data roots resolved where they are."""
        return machine.inside_roots(paths, roots, cwd)

    def rsync_target(self, path: str) -> tuple[list[str] | None, str]:
        """(the ssh command rsync reaches this host with, or None for this machine; the path as rsync
        names it): `rsync -e SSH SRC TARGET`."""
        return None, self.host_path(path)

    @abc.abstractmethod
    def ready(self, run_id: str, url: str | None, log_regex: str | None, wait_s: float = 0.0) -> bool:
        """hostside.ready: the service's readiness, asked on its host (waiting there up to wait_s
        for it to become ready)."""

    def await_change(self, run_id: str, timeout_s: float, log_offset: int | None = None) -> str | None:
        """hostside.await_change: wait on the host until the run ends, its log grows past log_offset,
        or timeout_s passes; what changed (None: nothing). An executor that cannot wait there sleeps."""
        time.sleep(min(timeout_s, 0.5))
        return None

    def input_sizes(self, requests: list[dict], cwd: str) -> list[dict]:
        """eaglelab.host.sizes.measure_all on the host: each input's size for a first-run ETA."""
        raise NotImplementedError(f"{type(self).__name__} cannot measure inputs")

    @abc.abstractmethod
    def read_log(self, run_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        """Bytes of the run's log from offset."""


def local_repo_dir(host: HostConfig) -> str:
    return str((REPO_ROOT / host.repo_dir).resolve()) if not host.repo_dir.startswith(("/", "~")) else host.repo_dir
