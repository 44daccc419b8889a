"""States are named by their members (eaglelab.model.RunState, StageState), never spelled as string
literals outside eaglelab/model.py, the one module that defines them (issue 31, item 2): a renamed
or misspelt state is then an AttributeError at import, not a comparison that is quietly never true.

An ast check over the code (py/eaglelab, status_web): a state's spelling is refused where code
decides or sets a state — compared or tested for membership (`== "running"`, `in ("failed", ...)`),
as a `"state":` value of a dict, assigned to a name or key called `state`, or as an `or` default.
Words in messages, docs and help texts are not code deciding anything and are not looked at.
ALLOWED lists the few literals that are a wire format of another vocabulary, each with why."""

from __future__ import annotations

import ast
from pathlib import Path

from eaglelab.model import RunState, StageState

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO / "py" / "eaglelab", REPO / "status_web")
DEFINES = REPO / "py" / "eaglelab" / "model.py"
STATES = frozenset(s.value for s in StageState) | frozenset(s.value for s in RunState)

# (file, text on the line) -> why the literal there is not a run or stage state
ALLOWED = {
    ("py/eaglelab/host/parse/state.py", 'c.reason != "killed"'):
        "a failure reason of the state JSON (docs/interfaces.md: reason killed), not a state",
    ("py/eaglelab/eta/schedule.py", '{"name": current, "state": "running"}'):
        "a phase's state in a run's eta.phases (docs/interfaces.md: done, running, pending), not a run's",
    ("py/eaglelab/eta/schedule.py", '{"name": name, "state": "pending"}'):
        "a phase's state in a run's eta.phases (docs/interfaces.md: done, running, pending), not a run's",
}


def _literals(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for e in node.elts:
            yield from _literals(e)


def _named_state(target: ast.AST) -> bool:
    if isinstance(target, ast.Name):
        return target.id == "state"
    if isinstance(target, ast.Subscript):
        return isinstance(target.slice, ast.Constant) and target.slice.value == "state"
    return isinstance(target, ast.Attribute) and target.attr == "state"


def spelled_states(tree: ast.AST):
    """The string constants of a tree that spell a state where code decides or sets one."""
    for n in ast.walk(tree):
        found = []
        if isinstance(n, ast.Compare):
            found = [c for side in (n.left, *n.comparators) for c in _literals(side)]
        elif isinstance(n, ast.Dict):
            found = [v for k, v in zip(n.keys, n.values)
                     if isinstance(k, ast.Constant) and k.value == "state" and isinstance(v, ast.Constant)]
        elif isinstance(n, ast.Assign) and any(_named_state(t) for t in n.targets):
            found = list(_literals(n.value))
        elif isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or):
            found = [v for v in n.values if isinstance(v, ast.Constant)]
        yield from (c for c in found if isinstance(c.value, str) and c.value in STATES)


def offences() -> list[str]:
    out = []
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            if path == DEFINES:
                continue
            rel = str(path.relative_to(REPO))
            lines = path.read_text().splitlines()
            for c in spelled_states(ast.parse("\n".join(lines), str(path))):
                line = lines[c.lineno - 1]
                if not any(f == rel and text in line for f, text in ALLOWED):
                    out.append(f"{rel}:{c.lineno}: {c.value!r} in {line.strip()[:100]}")
    return out


def test_states_are_named_by_their_members_outside_the_module_that_defines_them():
    found = offences()
    assert not found, ("spell these with eaglelab.model.RunState/StageState members (or add an ALLOWED entry "
                       "saying why the literal is a wire format):\n" + "\n".join(found))


def test_the_check_finds_each_form_and_the_allow_list_is_still_needed():
    code = ('if run["state"] == "running": pass\n'
            'ok = x in ("failed", "killed")\n'
            'rec = {"state": "pending"}\n'
            'snap["state"] = "stalled"\n'
            'state = s.get("state") or "gated"\n'
            'print("running late")  # words, not a decision\n'
            'if run["state"] == RunState.RUNNING: pass\n')
    got = [c.value for c in spelled_states(ast.parse(code))]
    assert sorted(got) == sorted(["running", "failed", "killed", "pending", "stalled", "gated"])
    for (f, text), _why in ALLOWED.items():  # a stale entry would hide the next real offence there
        assert text in (REPO / f).read_text(), (f, text)
