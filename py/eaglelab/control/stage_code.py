"""The code a stage runs, for its fingerprint: the import closure of its module within `eaglelab`.

Static, nothing is imported: each module's source is parsed with `ast` for the modules of the
package it imports (at module level and inside functions, absolute and relative) and its text for
the strings that name one (`importlib.import_module("eaglelab.x")`, vLLM's `kv_connector_module_path`,
a `-m eaglelab.stages.x` it starts; a name built at run time, `f"eaglelab.stages.{x}"`, stands for
every module under its fixed part), followed transitively. A package's `__init__` runs before any
module in it, so it belongs to the closure too. Modules outside `eaglelab` (stdlib, third-party)
are not followed: requirements.lock pins them. Imports under `if TYPE_CHECKING:` never run and do
not count; those under `if __name__ == "__main__":` run only when the file is the program (a stage's
`-m`): like the strings, they belong to the closure but not to the graph of what imports what
(`Source.library`, tests/test_import_graph.py). A file is read and parsed once per process while its
size and mtime stay the same; across processes, `code_digest(..., cache=FILE)` keeps what each file
named, keyed by the file's content digest and by the set of the package's module files (what a name
resolves to): a `lab status` reads ~25 files instead of parsing them (~0.1 s of CPU).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "eaglelab"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds eaglelab/ (py/)
_NAMES_A_MODULE = re.compile(rf"{PACKAGE}(\.\w+)*")
_STRING_NAME = re.compile(rf"""["']({PACKAGE}(?:\.\w+)*)["']""")  # "eaglelab.vllm_cpu_connector"
_BUILT_NAME = re.compile(rf"""f["']({PACKAGE}(?:\.\w+)*)\.\{{""")  # f"eaglelab.stages.{name}"


@dataclass(frozen=True)
class Source:
    """One module's file as parsed: what the fingerprint needs of it."""

    path: Path
    digest: str                    # sha256 of the file's bytes, 16 hex digits
    imports: frozenset[str]        # every module of the package it may run: the closure's edges
    library: frozenset[str]        # those its import statements import when it is imported, function level included
    module_level: frozenset[str]   # those imported while the module itself is imported


_parsed: dict[tuple[str, str, int, int], Source] = {}  # (name, path, size, mtime_ns) -> Source
_trees: dict[str, str] = {}  # root -> _tree_digest when _parsed was last checked against it


def module_path(name: str, root: Path = SOURCE_ROOT) -> Path | None:
    """The file of module `name` under root (a module's .py or a package's __init__.py), or None."""
    if not _NAMES_A_MODULE.fullmatch(name):
        return None
    base = root.joinpath(*name.split("."))
    for path in (base.parent / f"{base.name}.py", base / "__init__.py"):
        if path.is_file():
            return path
    return None


def source(name: str, root: Path = SOURCE_ROOT) -> Source:
    path = module_path(name, root)
    if path is None:
        raise ModuleNotFoundError(f"no module {name!r} under {root}")
    st = path.stat()
    key = (name, str(path), st.st_size, st.st_mtime_ns)
    if key not in _parsed:
        data = path.read_bytes()
        text = data.decode("utf-8", errors="replace")
        lib, top, others = _imports(name, path.name == "__init__.py", ast.parse(data, filename=str(path)), text, root)
        _parsed[key] = Source(path, hashlib.sha256(data).hexdigest()[:16], frozenset(lib | others), frozenset(lib),
                              frozenset(top))
    return _parsed[key]


def closure(name: str, root: Path = SOURCE_ROOT) -> list[str]:
    """Every module of the package that running module `name` may execute, `name` included, sorted."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        mod = todo.pop()
        for m in (*parents(mod), mod):
            if m not in seen:
                seen.add(m)
                todo.extend(source(m, root).imports)
    return sorted(seen)


def code_digest(name: str, root: Path = SOURCE_ROOT, cache: Path | None = None) -> dict[str, str]:
    """{file relative to eaglelab/: its digest} over the closure of module `name`. cache: a JSON file
    that keeps the parsed imports between processes (read here, written when it learned more)."""
    pkg = root / PACKAGE
    tree = _tree_digest(root)
    if _trees.get(str(root)) != tree:  # a module came or went: what a name resolves to may differ
        for key in [k for k in _parsed if Path(k[1]).is_relative_to(root)]:
            del _parsed[key]
        _trees[str(root)] = tree
    if cache is None:
        found = [source(m, root) for m in closure(name, root)]
        return {s.path.relative_to(pkg).as_posix(): s.digest for s in found}
    try:
        stored = json.loads(cache.read_text())
        known = stored["sources"] if stored.get("tree") == tree else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        known = {}  # absent or damaged: parsed anew, and written again
    out, seen, todo, learned = {}, set(), [name], False
    while todo:
        mod = todo.pop()
        for m in (*parents(mod), mod):
            if m in seen:
                continue
            seen.add(m)
            path = module_path(m, root)
            if path is None:
                raise ModuleNotFoundError(f"no module {m!r} under {root}")
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()[:16]
            entry = known.get(m)
            if not (isinstance(entry, dict) and entry.get("digest") == digest and isinstance(entry.get("imports"), list)):
                entry = {"digest": digest, "imports": sorted(source(m, root).imports)}
                known[m], learned = entry, True
            out[path.relative_to(pkg).as_posix()] = digest
            todo.extend(entry["imports"])
    if learned:
        try:
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"tree": tree, "sources": known}, sort_keys=True))
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only or full disk: the next call parses again, nothing is wrong
    return dict(sorted(out.items()))


def _tree_digest(root: Path) -> str:
    """The package's module files (names, not contents): a new or removed module changes what an
    unchanged file's imports resolve to."""
    names = []
    for folder, dirs, files in os.walk(root / PACKAGE):  # strings, not Paths: ~10x faster than rglob
        dirs.sort()
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        names += sorted(f"{rel}/{f}" for f in files if f.endswith(".py"))
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def parents(name: str) -> list[str]:
    """The packages holding module name, outermost first: Python imports each before it."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(name: str, is_package: bool, tree: ast.Module, text: str,
             root: Path) -> tuple[set[str], set[str], set[str]]:
    """The modules of the package named by an import or a string: (those the module's import statements
    import when it is imported, those of them at module level, the others: named in strings or imported
    only when it runs as a program).

    Only statements are walked (an import is one); strings are found in the text, where a name in a
    comment counts too (the stricter choice)."""
    package = name if is_package else name.rpartition(".")[0]
    lib: set[str] = set()
    top: set[str] = set()
    others: set[str] = set()

    def add(candidates: list[str], module_level: bool, other: bool = False) -> None:
        for c in candidates:
            for m in (*parents(c), c):
                if m.split(".")[0] == PACKAGE and module_path(m, root) is not None:
                    (others if other else lib).add(m)
                    if module_level and not other:
                        top.add(m)

    def visit(statements: list, module_level: bool, other: bool = False) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                add([a.name for a in node.names], module_level, other)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node.module, node.level, package)
                if base is not None:  # `from X import y`: X, and X.y when y is a module rather than a name in X
                    add([base, *(f"{base}.{a.name}" for a in node.names if a.name != "*")], module_level, other)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.orelse, module_level, other)
            elif isinstance(node, ast.If) and _is_main_check(node.test):
                visit(node.body, module_level, True)
                visit(node.orelse, module_level, other)
            else:
                inner = module_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):  # class, if, try, with, match
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        visit(children, inner, other)

    visit(tree.body, True)
    add([m.group(1) for m in _STRING_NAME.finditer(text)], False, True)  # run when (if ever) is not known
    for m in _BUILT_NAME.finditer(text):
        add(modules_under(m.group(1), root), False, True)  # a name built at run time: any module it can be
    return lib, top, others - lib


def modules_under(package: str, root: Path = SOURCE_ROOT) -> list[str]:
    """Every module in package (its own `__init__` included), sorted by file."""
    folder = root.joinpath(*package.split("."))
    return [".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            for p in sorted(folder.rglob("*.py"))] if (folder / "__init__.py").is_file() else []


def _absolute(module: str | None, level: int, package: str) -> str | None:
    if level == 0:
        return module
    parts = package.split(".")
    if level - 1 >= len(parts):
        return None  # beyond the top package: Python refuses it too
    base = ".".join(parts[:len(parts) - (level - 1)])
    return f"{base}.{module}" if module else base


def _is_main_check(test: ast.expr) -> bool:
    """`__name__ == "__main__"`"""
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
