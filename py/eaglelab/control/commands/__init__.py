"""CLI commands beyond the core ones in cli.py, one module per concern.

Each module here defines click commands/groups and lists them in a module-level `COMMANDS`, and
INDEX below names the module of each: `lab X` imports X's module only (the others bring croniter,
rich, numpy, waitress: `lab status --json`, which tests and cron run often, pays for none of them).
A new concern adds a module here and its names to INDEX, and never edits cli.py, so the parts of
eaglelab grow side by side (tests/test_cli_imports.py checks INDEX against the modules).
"""

from __future__ import annotations

import importlib
import pkgutil

import click

INDEX: dict[str, str] = {  # command name -> module of this package that defines it
    "cron": "cron", "plan": "cron", "eta": "eta", "preflight": "hosts", "sync": "hosts", "wheelhouse": "hosts",
    "mirror": "hosts", "notify": "notify", "parse": "parse", "tail": "parse", "services": "services",
    "summary": "summary", "web": "web",
}


def command(name: str) -> click.Command | None:
    """The command `name` (imports its module only), or None when no module here defines it."""
    if name not in INDEX:
        return None
    module = importlib.import_module(f"{__name__}.{INDEX[name]}")
    return next((c for c in getattr(module, "COMMANDS", []) if c.name == name), None)


def all_commands() -> list[click.Command]:
    """Every command of every module here (imports them all)."""
    found: list[click.Command] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.extend(getattr(module, "COMMANDS", []))
    return found
