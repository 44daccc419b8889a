"""`lab parse --json` prints exactly what it printed before: a guard for work on the parser's speed.

Every log (*.log) under tests/fixtures/logs/ and bench/corpus/, plus a small generated tqdm-heavy log (long
\\r-frame runs, so the frame sampler is at work), parsed three ways (default, --every-frame,
--history), and the printed JSON compared with tests/fixtures/parse_golden.json: strings, integers,
booleans, states and the shape exactly; floats within a tolerance (figures are rounded where they
are produced, see eaglelab.figures, but a value on a rounding boundary may still land either side
of it with another CPU's or BLAS's last bits).

A change meant to change what the parser says: regenerate with
    EAGLELAB_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_parse_golden.py
and review the golden file's diff like code.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglelab.control.commands.parse import parse_cmd

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "parse_golden.json"
MODES = {"default": [], "every_frame": ["--every-frame"], "history": ["--history"]}
LOGS = sorted(p for d in (ROOT / "tests" / "fixtures" / "logs", ROOT / "bench" / "corpus")
              for p in d.rglob("*.log") if p.is_file())


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


REL_TOL = 1e-6  # printed figures (rates, counts) come back exactly; this is for estimates ...
ABS_TOL = 0.11  # ... rounded to 0.1 s, which may land one step apart


def same(want: object, got: object, path: str = "") -> str | None:
    """Where got differs from want in what it means (None: nowhere): floats compared with a
    tolerance, everything else exactly."""
    if isinstance(want, float) or isinstance(got, float):
        if isinstance(want, (int, float)) and isinstance(got, (int, float)) and not isinstance(want, bool) \
                and not isinstance(got, bool) and math.isclose(want, got, rel_tol=REL_TOL, abs_tol=ABS_TOL):
            return None
        return f"{path}: {want!r} != {got!r}"
    if isinstance(want, dict) and isinstance(got, dict):
        if list(want) != list(got):
            return f"{path}: keys {sorted(set(want) ^ set(got))} differ"
        return next((d for k in want if (d := same(want[k], got[k], f"{path}.{k}"))), None)
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return f"{path}: {len(want)} items != {len(got)}"
        return next((d for i, (a, b) in enumerate(zip(want, got)) if (d := same(a, b, f"{path}[{i}]"))), None)
    return None if type(want) is type(got) and want == got else f"{path}: {want!r} != {got!r}"


def test_tolerant_comparison_still_tells_differences_apart() -> None:
    assert same({"eta_s": 12.3, "state": "running"}, {"eta_s": 12.4, "state": "running"}) is None
    assert same({"eta_s": 12.3}, {"eta_s": 13.3}) is not None
    assert same({"n": 3}, {"n": 4}) is not None and same({"state": "failed"}, {"state": "running"}) is not None
    assert same({"a": 1, "b": 2}, {"b": 2, "a": 1}) is not None  # key order is part of what is printed
    assert same([1.0, 2.0], [1.0]) is not None and same(None, 0.0) is not None


def test_parse_output_is_unchanged(tqdm_log: Path) -> None:
    got = {}
    for path in [*LOGS, tqdm_log]:
        name = path.name if path == tqdm_log else str(path.relative_to(ROOT))
        for mode, args in MODES.items():
            got[f"{name} {mode}"] = _printed(path, args)
    if os.environ.get("EAGLELAB_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert len(LOGS) > 40
    assert sorted(want) == sorted(got), (f"logs not in the golden file: {sorted(set(got) - set(want))[:6]}; "
                                         f"gone from disk: {sorted(set(want) - set(got))[:6]} (regenerate, see the top)")
    changed = {k: d for k in sorted(want) if (d := same(json.loads(want[k]), json.loads(got[k]), k))}
    assert not changed, f"`lab parse --json` prints something else: {list(changed.values())[:10]}"
