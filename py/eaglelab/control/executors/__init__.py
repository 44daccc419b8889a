"""Where a stage runs: one small interface (base.Executor), one class per way of reaching a host."""

from __future__ import annotations

from eaglelab.config import HostConfig
from eaglelab.errors import ConfigError

from .base import Executor, HostUnreachable


# Each reach loads its executor when a host needs it: ssh's log mirror takes filelock, which a lab
# of local hosts never loads (`lab status --json`: tests/test_cli_imports.py).
def for_host(host: HostConfig) -> Executor:
    if host.reach == "local":
        from .local import LocalExecutor  # see above
        return LocalExecutor(host)
    if host.reach == "ssh":
        from .ssh import SshExecutor  # see above
        return SshExecutor(host)
    if host.reach == "slurm":
        from .slurm import SlurmExecutor  # see above
        return SlurmExecutor(host)
    raise ConfigError(f"host {host.name!r}: unknown reach {host.reach!r}")


__all__ = ["Executor", "HostUnreachable", "for_host"]
