"""The order of the floors: no module of eaglelab imports itself back, read statically
(control/stage_code.py). Neither at import time (module-level imports) nor with the imports inside
functions counted too has the graph a circle."""

from __future__ import annotations

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
