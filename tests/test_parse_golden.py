"""`lab parse --json` prints exactly what it printed before: a guard for work on the parser's speed.

Every log under tests/fixtures/logs/ and bench/corpus/, plus a small generated tqdm-heavy log (long
\\r-frame runs, so the frame sampler is at work), parsed three ways (default, --every-frame,
--history), and the printed JSON compared byte for byte with tests/fixtures/parse_golden.json.

A change meant to change what the parser says: regenerate with
    EAGLELAB_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_parse_golden.py
and review the golden file's diff like code.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglelab.commands.parse import parse_cmd

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "parse_golden.json"
MODES = {"default": [], "every_frame": ["--every-frame"], "history": ["--history"]}
LOGS = sorted(p for d in (ROOT / "tests" / "fixtures" / "logs", ROOT / "bench" / "corpus")
              for p in d.rglob("*") if p.is_file() and p.suffix != ".md")


@pytest.fixture(scope="module")
def tqdm_log(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bench_parse import tqdm_heavy
    finally:
        sys.path.remove(str(ROOT / "bench"))
    path = tmp_path_factory.mktemp("golden") / "tqdm-heavy-1mb.log"
    tqdm_heavy(path, 1, seed=7)  # seeded: the same bytes every time
    return path


def _printed(path: Path, args: list[str]) -> str:
    r = CliRunner().invoke(parse_cmd, [str(path), "--json", *args])
    assert r.exit_code == 0, r.output
    return r.output


def test_parse_output_is_unchanged(tqdm_log: Path) -> None:
    got = {}
    for path in [*LOGS, tqdm_log]:
        name = path.name if path == tqdm_log else str(path.relative_to(ROOT))
        for mode, args in MODES.items():
            got[f"{name} {mode}"] = _printed(path, args)
    if os.environ.get("EAGLELAB_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert len(LOGS) > 40 and len(want) == len(got)
    changed = sorted(k for k in want if got.get(k) != want[k])
    assert not changed, f"`lab parse --json` prints something else for: {changed[:10]}"
