"""CLI commands beyond the core ones in cli.py, one module per concern.

Each module here defines click commands/groups and lists them in a module-level `COMMANDS`;
cli.py adds every one of them to the `lab` group. A new concern adds a module here and never
edits cli.py, so the parts of eaglelab grow side by side.
"""

from __future__ import annotations

import importlib
import pkgutil

import click


def all_commands() -> list[click.Command]:
    found: list[click.Command] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.extend(getattr(module, "COMMANDS", []))
    return found
