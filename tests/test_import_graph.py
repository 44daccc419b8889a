"""The order of the floors: no module of eaglelab imports itself back, read statically
(control/stage_code.py). Neither at import time (module-level imports) nor with the imports inside
functions counted too has the graph a circle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO
from eaglelab.control import stage_code


def modules() -> list[str]:
    return stage_code.modules_under(stage_code.PACKAGE, stage_code.SOURCE_ROOT)


def graph(edges: str) -> dict[str, set[str]]:
    """module -> the modules it imports (a module's own packages left out: Python imports them
    first, whatever imports it)."""
    out = {}
    for m in modules():
        own = {m, *stage_code.parents(m)}
        out[m] = {t for t in getattr(stage_code.source(m), edges) if t not in own}
    return out


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan), each sorted, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_module_imports_itself_back_at_import_time():
    assert circles(graph("module_level")) == []


def test_no_module_imports_itself_back_even_through_imports_inside_functions():
    """The last circle (config -> placement/side_jobs -> config) was untied in issue 31: the stages
    and hosts they add are made through Config.make_stage/make_host."""
    assert circles(graph("library")) == []


def test_the_circle_finder_finds_a_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(g) == [["a", "b", "c"]]


def function_level_imports(tree: ast.AST, in_function: bool = False):
    """Every import statement inside a function (not under `if TYPE_CHECKING:`)."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            continue
        if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from function_level_imports(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))


def lazy_imports_without_a_reason(root: Path) -> list[str]:
    """Imports of the project's own modules inside a function with no comment saying why (on the
    line or the one above): an import belongs at the top, where it shows the order of the floors,
    unless something (a CPU budget, an optional part, a heavy dependency) says otherwise."""
    found = []
    for path in sorted([*root.joinpath("py/eaglelab").rglob("*.py"), *root.joinpath("status_web").rglob("*.py")]):
        text = path.read_text()
        lines = ["", *text.splitlines()]  # 1-based, like ast's line numbers
        for node in function_level_imports(ast.parse(text)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            own = getattr(node, "level", 0) > 0 or any(n.startswith(("eaglelab", "status_web")) for n in names)
            said = "#" in lines[node.end_lineno] or lines[node.lineno - 1].strip().startswith("#")
            if own and not said:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {lines[node.lineno].strip()}")
    return found


def test_every_import_inside_a_function_says_why():
    assert lazy_imports_without_a_reason(REPO) == []


def test_the_lazy_import_finder_finds_one(tmp_path):
    (tmp_path / "py/eaglelab").mkdir(parents=True)
    (tmp_path / "status_web").mkdir()
    (tmp_path / "py/eaglelab/a.py").write_text(
        "def f():\n    from . import b\n\n\ndef g():\n    # numpy: only here\n    from .c import d\n")
    assert lazy_imports_without_a_reason(tmp_path) == ["py/eaglelab/a.py:2: from . import b"]


NOQA = re.compile(r"#\s*noqa(?::\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?(?P<why>.*)$")


def noqa_without_a_reason(root: Path) -> list[str]:
    """`# noqa` markers with nothing after their codes: each says why the rule does not apply."""
    found = []
    files = [p for d in ("py", "status_web", "tests", "bench", "bin") for p in root.joinpath(d).rglob("*.py")]
    for path in sorted(files):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = NOQA.search(line)
            if m and len(m["why"].strip(" -:—()")) < 3:
                found.append(f"{path.relative_to(root)}:{n}")
    return found


def test_every_noqa_says_why(tmp_path):
    assert noqa_without_a_reason(REPO) == []
    (tmp_path / "py").mkdir()
    (tmp_path / "py/a.py").write_text("import x  # noqa: F401\nimport y  # noqa: F401 - re-exported\n")
    assert noqa_without_a_reason(tmp_path) == ["py/a.py:1"]
