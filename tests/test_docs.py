"""The README says what the Makefile does: every `## ` target is in the README's `make help` block."""

from __future__ import annotations

import re

from conftest import REPO


def test_readme_lists_every_make_target():
    targets = re.findall(r"^([a-zA-Z_ -]+):.*## ", (REPO / "Makefile").read_text(), re.M)
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("`make help` lists every target:"):]
    block = block[:block.index("```", block.index("```") + 3)]
    lines = block.splitlines()
    missing = [t.strip() for t in targets if not any(ln.startswith(f"  {t.strip()} ") for ln in lines)]
    assert not missing, f"README.md's `make help` block lacks: {missing} (paste the output of `make help`)"


def test_the_make_test_parts_hold_every_test_file_once():
    import suite_plan
    stems = sorted(p.stem for p in (REPO / "tests").glob("test_*.py"))
    wrong = {s: suite_plan.parts_of(s) for s in stems if len(suite_plan.parts_of(s)) != 1}
    assert not wrong, f"each test file belongs to exactly one part of tests/suite_plan.py PARTS: {wrong}"
    targets = re.search(r"^(test-parse .*?): setup", (REPO / "Makefile").read_text(), re.M).group(1).split()
    assert sorted(targets) == sorted(f"test-{p}" for p in suite_plan.PARTS)
