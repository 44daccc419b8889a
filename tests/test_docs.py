"""The docs say what is there. The `make help` block (docs/cli.md) lists every target; and every
module path, `lab` command, make target and config key that README.md or a page of docs/ names
exists (read from the text: backticked spans, command lines of code blocks, YAML examples), so a
renamed module or a removed command cannot leave a page that sends a reader to nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from eaglelab import config as config_mod
from eaglelab.control import commands, stage_code
from eaglelab.control.cli import cli

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Names the docs print on purpose that are no config key, module or command: the error an unknown
# key gets, and the lines of shell and output quoted in code blocks.
NOT_CONFIG = {"dependz_on"}  # docs/configuration.md: the error a misspelt key gets
NOT_THERE = {
    "conf/profiles/big.yaml",  # docs/configuration.md: a profile in an example error message
    "tests/output/web_crawl.json",  # written by tests/test_web_crawl.py when it runs
}
NAME_MAPS = {"hosts", "stages", "vars", "placement", "gates", "shared", "env"}  # keys below: names of yours


def test_the_make_help_block_lists_every_make_target():
    targets = re.findall(r"^([a-zA-Z_ -]+):.*## ", (REPO / "Makefile").read_text(), re.M)
    text = (REPO / "docs" / "cli.md").read_text()
    block = text[text.index("`make help` lists every target:"):]
    block = block[:block.index("```", block.index("```") + 3)]
    lines = block.splitlines()
    missing = [t.strip() for t in targets if not any(ln.startswith(f"  {t.strip()} ") for ln in lines)]
    assert not missing, f"docs/cli.md's `make help` block lacks: {missing} (paste the output of `make help`)"


def test_the_make_test_parts_hold_every_test_file_once():
    import suite_plan
    stems = sorted(p.stem for p in (REPO / "tests").glob("test_*.py"))
    wrong = {s: suite_plan.parts_of(s) for s in stems if len(suite_plan.parts_of(s)) != 1}
    assert not wrong, f"each test file belongs to exactly one part of tests/suite_plan.py PARTS: {wrong}"
    targets = re.search(r"^(test-parse .*?): setup", (REPO / "Makefile").read_text(), re.M).group(1).split()
    assert sorted(targets) == sorted(f"test-{p}" for p in suite_plan.PARTS)


# -- what the text names ---------------------------------------------------------------------------

def spans(text: str) -> list[str]:
    """Inline code (`...`) outside fenced blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", prose)


def code_lines(text: str) -> list[str]:
    """The lines of fenced blocks that are not YAML."""
    out = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S):
        if lang != "yaml":
            out += body.splitlines()
    return out


def yaml_blocks(text: str) -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", text, flags=re.M | re.S)


def module_exists(name: str) -> bool:
    """eaglelab.x.y is a module, or a name defined at the top of one (a function, class, constant)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        path = stage_code.module_path(".".join(parts[:i]))
        if path is None:
            continue
        rest = parts[i:]
        if not rest:
            return True
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
        defined |= {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        defined |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
        defined |= {e.value for n in tree.body if isinstance(n, ast.Assign) and any(  # __all__, lazy names too
            isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets) and isinstance(n.value, ast.List)
            for e in n.value.elts if isinstance(e, ast.Constant)}
        return rest[0] in defined
    return False


PATH = re.compile(r"(?<![\w/.-])((?:py/)?eaglelab/[\w/.*]*[\w*]|(?:control|host|stages|eta)/[\w/*]+\.py|"
                  r"(?:bench|tests|bin|conf|docs|status_web)/[\w/.*-]*[\w*])")


def path_exists(p: str) -> bool:
    """A file or folder of the repository (a glob: one at least), from its root, py/ or py/eaglelab/."""
    if p in NOT_THERE:
        return True
    base = (REPO if p.startswith(("py/", "bench/", "tests/", "bin/", "conf/", "docs/", "status_web/"))
            else REPO / "py" if p.startswith("eaglelab/") else REPO / "py" / "eaglelab")
    return any(base.glob(p)) if "*" in p else (base / p).exists()


def lab_commands() -> dict[str, set[str] | None]:
    """command -> its subcommands (a group) or None."""
    out: dict[str, set[str] | None] = {}
    for name in {*cli.commands, *commands.INDEX}:
        cmd = cli.commands.get(name) or commands.command(name)
        out[name] = set(cmd.commands) if hasattr(cmd, "commands") else None
    return out


def make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    found = set()
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z0-9_ .$()%-]+):(?!=)", line)
        if m and not line.startswith((".PHONY", "\t")):
            found.update(w for w in m.group(1).split() if "$" not in w)
    return found


def config_fields() -> set[str]:
    names = set()
    for obj in vars(config_mod).values():
        if isinstance(obj, type) and issubclass(obj, config_mod.BaseModel):
            names |= set(obj.model_fields)
    return names


def yaml_keys(data, parent: str | None = None):
    if isinstance(data, dict):
        for k, v in data.items():
            if parent not in NAME_MAPS:
                yield str(k)
            yield from yaml_keys(v, str(k))
    elif isinstance(data, list):
        for v in data:
            yield from yaml_keys(v, parent)


def named(doc: Path) -> dict[str, list[str]]:
    """What one doc names: paths, modules, lab commands, make targets, config keys."""
    text = doc.read_text()
    found: dict[str, list[str]] = {"paths": [], "files": [], "modules": [], "lab": [], "make": [], "config": []}
    for s in spans(text) + code_lines(text):
        for p in PATH.findall(s):
            if not re.search(r"[A-Z]{2,}|<|\.\.\.|…", p):  # NAME, <run_id>: placeholders
                found["paths"].append(p)
        found["files"] += re.findall(r"^(\w+\.py)$", s)  # `records.py`: a file of the tree, wherever
        found["modules"] += [m for m in re.findall(r"(?<![\w/])eaglelab(?:\.\w+)+", s)
                             if not re.search(r"\.[A-Z]+\b", m)]  # eaglelab.stages.NAME: a placeholder
        command = s.strip().removeprefix("$ ")  # a command: the span, or a code block's line, begins with it
        m = re.match(r"(?:bin/|\.venv/bin/)?lab((?:\s+--?[\w-]+(?:\s+[\w.-]+)?)*)\s+([a-z][\w-]*)(?![\w:-])"
                     r"(?:\s+([a-z][\w-]*)(?![\w:-]))?", command)
        if m:
            found["lab"].append(" ".join(filter(None, m.group(2, 3))))
        m = re.match(r"make((?:\s+[\w=\"-]+)+)", command)
        if m:
            found["make"] += [w for w in m.group(1).split() if "=" not in w and '"' not in w and not w.isupper()]
        for key in re.findall(r"^((?:hosts|stages|web|notify|transfers|placement|gates|ssh|slurm)\.[\w.]+)", s):
            found["config"].append(key)
    for block in yaml_blocks(text):
        try:
            data = yaml.safe_load(block.replace("...", "").replace("…", ""))
        except yaml.YAMLError as e:
            raise AssertionError(f"{doc.name}: a YAML example does not parse: {e}") from None
        found["config"] += list(yaml_keys(data))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_name_a_doc_gives_exists(doc):
    found = named(doc)
    cmds, targets, fields = lab_commands(), make_targets(), config_fields()
    bad = [f"path {p}" for p in found["paths"] if not path_exists(p)]
    bad += [f"module {m}" for m in found["modules"] if not module_exists(m)]
    bad += [f"file {f}" for f in found["files"]
            if not any(next((REPO / d).rglob(f), None) for d in ("py", "status_web", "bench", "tests", "bin", "docs"))]
    for c in found["lab"]:
        name, _, sub = c.partition(" ")
        if name not in cmds:
            bad.append(f"command `lab {name}`")
        elif cmds[name] is not None and sub and sub not in cmds[name]:
            bad.append(f"command `lab {c}`")
    bad += [f"make target {t}" for t in found["make"] if t not in targets]
    for key in found["config"]:
        parts = key.split(".")
        for i, part in enumerate(parts):
            if i and parts[i - 1] in NAME_MAPS or part.isupper() or part in NOT_CONFIG:
                continue
            if part not in fields and part not in NAME_MAPS:
                bad.append(f"config key {key}")
                break
    assert not bad, f"{doc.name} names what is not there: {sorted(set(bad))}"


def test_the_checker_sees_what_is_not_there(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("Run `lab statuz`, `make tset`, read `py/eaglelab/control/nothing.py`, `gone.py` and\n"
                   "`eaglelab.control.status.gone`; set `web.nohost`.\n\n```yaml\nhosts:\n  gpu1:\n"
                   "    reach: ssh\n    sssh: {host: x}\n```\n")
    found = named(doc)
    assert found["lab"] == ["statuz"] and found["make"] == ["tset"] and found["files"] == ["gone.py"]
    assert not path_exists(found["paths"][0]) and not module_exists(found["modules"][0])
    assert "sssh" in found["config"] and "gpu1" not in found["config"] and "web.nohost" in found["config"]
    with pytest.raises(AssertionError, match="statuz.*tset|names what is not there"):
        test_every_name_a_doc_gives_exists(doc)


def test_the_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 320, "README.md is the front door: the rest belongs in docs/"
    for page in re.findall(r"\]\((docs/[\w.-]+\.md)", readme):
        assert (REPO / page).exists(), page
    linked = set(re.findall(r"\(docs/([\w.-]+\.md)", readme))
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
