"""Where a stage runs: one small interface (base.Executor), one class per way of reaching a host."""

from __future__ import annotations

from eaglelab.config import HostConfig
from eaglelab.errors import ConfigError

from .base import Executor, HostUnreachable


def for_host(host: HostConfig) -> Executor:
    if host.reach == "local":
        from .local import LocalExecutor
        return LocalExecutor(host)
    if host.reach == "ssh":
        try:
            from .ssh import SshExecutor
        except ImportError as e:  # pragma: no cover - the ssh executor ships with the package
            raise ConfigError(f"host {host.name!r}: reach: ssh is not available in this install ({e})") from None
        return SshExecutor(host)
    if host.reach == "slurm":
        from .slurm import SlurmExecutor
        return SlurmExecutor(host)
    raise ConfigError(f"host {host.name!r}: unknown reach {host.reach!r}")


__all__ = ["Executor", "HostUnreachable", "for_host"]
