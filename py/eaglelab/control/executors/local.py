"""This machine: hostside's functions called in-process (no ssh, same code as on a remote host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from eaglelab.errors import HostError
from eaglelab.host import hostfacts, hostside, machine, sizes

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
        return sizes.measure_all(requests, cwd)

    def launch(self, spec: dict) -> dict:
        try:
            return hostside.launch(self.work_dir, {**spec, "python": spec.get("python") or self.python})
        except hostside.LaunchError as e:  # an error to read, as over ssh, never a traceback
            raise HostError(f"host {self.host.name!r}: {e}") from None

    def report(self, stage: str | None = None) -> dict:
        return hostside.report(self.work_dir, stage)

    def stop(self, run_id: str, grace_s: float = 30.0) -> dict:
        """hostside.stop in a process of its own session, as over ssh: a Ctrl-C or a kill of `lab stop`
        during the grace period leaves the escalation (KILL after grace_s) running, so a stage that
        ignores TERM is never left alive with its stop half done."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(hostside.__file__).parents[2]),
                                                                        os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen([sys.executable, "-m", "eaglelab.host.hostside", "stop", "-"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
        out, err = proc.communicate(json.dumps({"work_dir": self.work_dir, "run_id": run_id,
                                                "grace_s": grace_s}).encode())
        try:
            result = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise HostError(f"host {self.host.name!r}: cannot stop {run_id}: hostside stop answered rc "
                            f"{proc.returncode}: {err.decode(errors='replace').strip()[-300:]!r}") from None
        if isinstance(result, dict) and "error" in result:  # its directory vanished or was damaged
            why = str(result["error"]).split(": ", 1)[-1]  # the message, without the exception's name
            raise HostError(f"host {self.host.name!r}: cannot stop {run_id}: {why}; nothing was signalled "
                            f"(`lab status` shows what the host reports of it)")
        return result

    def ready(self, run_id: str, url: str | None, log_regex: str | None, wait_s: float = 0.0) -> bool:
        return hostside.ready(self.work_dir, run_id, url, log_regex, wait_s)["ready"]

    def await_change(self, run_id: str, timeout_s: float, log_offset: int | None = None) -> str | None:
        return hostside.await_change(self.work_dir, run_id, timeout_s, log_offset)["changed"]

    def read_log(self, run_id: str, offset: int = 0, limit: int = 1 << 20) -> bytes:
        return hostside.read_log(self.work_dir, run_id, offset, limit)
