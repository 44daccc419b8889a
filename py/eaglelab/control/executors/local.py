"""This machine: hostside's functions called in-process (no ssh, same code as on a remote host)."""

from __future__ import annotations

import os
import sys

from eaglelab.errors import HostError
from eaglelab.host import hostfacts, hostside, machine
from eaglelab.model import BadRecord

from .base import Executor, local_repo_dir


class LocalExecutor(Executor):
    def repo_dir(self) -> str:
        return local_repo_dir(self.host)

    @property
    def python(self) -> str:
        # A checkout without its venv (e.g. tests run by another interpreter) uses this one.
        p = self.host_path(self.host.python)
        return p if os.path.exists(p) else sys.executable

    def facts(self, inputs: list[str], outputs: list[str], cwd: str) -> dict:
        return hostfacts.facts(self.work_dir, inputs, outputs, cwd)

    def inputs_digest(self, paths: list[str], cwd: str) -> dict[str, str]:
        return machine.inputs_digest(paths, cwd)

    def paths_info(self, paths: list[str], cwd: str) -> dict[str, dict]:
        return machine.paths_info(paths, cwd)

    def host_path(self, p: str) -> str:
        return os.path.expanduser(super().host_path(p))

    def input_sizes(self, requests: list[dict], cwd: str) -> list[dict]:
        from eaglelab.host import sizes
        return sizes.measure_all(requests, cwd)

    def launch(self, spec: dict) -> dict:
        try:
            return hostside.launch(self.work_dir, {**spec, "python": spec.get("python") or self.python})
        except hostside.LaunchError as e:  # an error to read, as over ssh, never a traceback
            raise HostError(f"host {self.host.name!r}: {e}") from None

    def report(self, stage: str | None = None) -> dict:
        return hostside.report(self.work_dir, stage)

    def stop(self, run_id: str, grace_s: float = 30.0) -> dict:
        try:
            return hostside.stop(self.work_dir, run_id, grace_s)
        except BadRecord as e:  # its directory vanished or was damaged: nothing is signalled
            raise HostError(f"host {self.host.name!r}: cannot stop {run_id}: {e}; nothing was signalled "
                            f"(`lab status` shows what the host reports of it)") from None

    def ready(self, run_id: str, url: str | None, log_regex: str | None, wait_s: float = 0.0) -> bool:
        return hostside.ready(self.work_dir, run_id, url, log_regex, wait_s)["ready"]

    def await_change(self, run_id: str, timeout_s: float, log_offset: int | None = None) -> str | None:
        return hostside.await_change(self.work_dir, run_id, timeout_s, log_offset)["changed"]

    def read_log(self, run_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        return hostside.read_log(self.work_dir, run_id, offset, limit)
