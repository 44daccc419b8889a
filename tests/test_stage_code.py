"""The fingerprint hashes the code a stage runs: its module's import closure within eaglelab
(control/stage_code.py). A change in a module that train imports reruns train; a change in a module
no stage imports reruns nothing."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from eaglelab.control import stage_code
from eaglelab.control.lab import Lab
from eaglelab.control.pipeline.plan import make_plan


def write_package(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


# A package of its own: each way a module can reach another, and the ways that do not count.
PACKAGE = {
    "eaglelab/__init__.py": "",
    "eaglelab/a.py": """\
        import os, json                      # not ours: not followed
        from . import b                      # a submodule, relative
        from .c import NAME                  # a name in a module: the module
        import eaglelab.sub.d                # absolute, through a package
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from . import typing_only        # never runs
        def later():
            from .e import thing             # function level
        CONNECTOR = "eaglelab.f"             # a module named in a string (vLLM loads it)
        """,
    "eaglelab/b.py": "from .g import x\n",
    "eaglelab/c.py": "NAME = 1\n",
    "eaglelab/sub/__init__.py": "from . import h\n",
    "eaglelab/sub/d.py": "",
    "eaglelab/sub/h.py": "",
    "eaglelab/typing_only.py": "",
    "eaglelab/e.py": "",
    "eaglelab/f.py": "",
    "eaglelab/g.py": "",
    "eaglelab/unrelated.py": "import eaglelab.a\n",
    "eaglelab/runs/__init__.py": "",
    "eaglelab/runs/one.py": "",
    "eaglelab/runs/two.py": "",
    "eaglelab/starter.py": "def start(name):\n    return ['-m', f'eaglelab.runs.{name}']\n",
    "eaglelab/program.py": "from . import c\nif __name__ == '__main__':\n    from . import e\n",
}


def test_closure_follows_every_kind_of_import_within_the_package_only(tmp_path):
    write_package(tmp_path, PACKAGE)
    assert stage_code.closure("eaglelab.a", tmp_path) == [
        "eaglelab", "eaglelab.a", "eaglelab.b", "eaglelab.c", "eaglelab.e", "eaglelab.f", "eaglelab.g",
        "eaglelab.sub", "eaglelab.sub.d", "eaglelab.sub.h"]
    # what runs when the module is imported, and what only may run later
    src = stage_code.source("eaglelab.a", tmp_path)
    assert sorted(src.module_level) == ["eaglelab", "eaglelab.b", "eaglelab.c", "eaglelab.sub", "eaglelab.sub.d"]
    assert sorted(src.library - src.module_level) == ["eaglelab.e"]  # imported inside a function
    assert sorted(src.imports - src.library) == ["eaglelab.f"]  # named in a string: run, not imported
    # run as a program, a module imports more than when it is imported
    program = stage_code.source("eaglelab.program", tmp_path)
    assert sorted(program.library) == ["eaglelab", "eaglelab.c"]
    assert stage_code.closure("eaglelab.program", tmp_path) == [
        "eaglelab", "eaglelab.c", "eaglelab.e", "eaglelab.program"]
    # a name built at run time stands for every module it can be
    assert stage_code.closure("eaglelab.starter", tmp_path) == [
        "eaglelab", "eaglelab.runs", "eaglelab.runs.one", "eaglelab.runs.two", "eaglelab.starter"]


def test_code_digest_changes_with_a_file_in_the_closure_only(tmp_path):
    write_package(tmp_path, PACKAGE)
    before = stage_code.code_digest("eaglelab.a", tmp_path)
    assert sorted(before) == ["__init__.py", "a.py", "b.py", "c.py", "e.py", "f.py", "g.py",
                              "sub/__init__.py", "sub/d.py", "sub/h.py"]
    (tmp_path / "eaglelab" / "unrelated.py").write_text("import eaglelab.a\nCHANGED = 1\n")
    assert stage_code.code_digest("eaglelab.a", tmp_path) == before
    (tmp_path / "eaglelab" / "g.py").write_text("x = 2\n")  # two imports away
    after = stage_code.code_digest("eaglelab.a", tmp_path)
    assert {k for k in before if before[k] != after[k]} == {"g.py"}


def test_code_digest_with_a_cache_file_is_the_digest_without_it(tmp_path):
    """The cache between processes (what each file imports) never changes the answer: a changed file,
    a new module that an unchanged import now resolves to, a damaged cache file."""
    root, cache = tmp_path / "code", tmp_path / "stage_code.json"
    write_package(root, PACKAGE)
    stage_code._parsed.clear()
    assert stage_code.code_digest("eaglelab.a", root, cache=cache) == stage_code.code_digest("eaglelab.a", root)
    assert cache.exists()
    stage_code._parsed.clear()  # a new process: only the file knows
    assert stage_code.code_digest("eaglelab.a", root, cache=cache) == stage_code.code_digest("eaglelab.a", root)
    (root / "eaglelab" / "g.py").write_text("from . import e\nx = 2\n")
    (root / "eaglelab" / "c.py").write_text("NAME = 1\nfrom .sub import k\n")  # sub.k is no module yet: a name
    after = stage_code.code_digest("eaglelab.a", root, cache=cache)
    assert after == stage_code.code_digest("eaglelab.a", root) and "sub/k.py" not in after
    (root / "eaglelab" / "sub" / "k.py").write_text("")  # c.py unchanged, but its import is now a module
    assert "sub/k.py" in stage_code.code_digest("eaglelab.a", root, cache=cache)
    cache.write_text("{not json")
    assert stage_code.code_digest("eaglelab.a", root, cache=cache) == stage_code.code_digest("eaglelab.a", root)


def test_the_real_closures_hold_the_stages_they_call_and_no_other():
    train = stage_code.closure("eaglelab.stages.train")
    assert {"eaglelab.manifest", "eaglelab.errors", "eaglelab.fsutil"} <= set(train)
    # train calls acceptance; what it shares with extract lives in stages/common (stages import no
    # other stage for a name: a change in extract or serve is no reason to retrain)
    assert [m for m in train if m.startswith("eaglelab.stages.")] == [
        "eaglelab.stages.acceptance", "eaglelab.stages.common", "eaglelab.stages.train",
        "eaglelab.stages.train_memory", "eaglelab.stages.warm_start"]
    # serve runs serve_smoke, which runs eval's metrics; it names vLLM's CPU connector as a string
    assert {"eaglelab.stages.serve_smoke", "eaglelab.stages.eval", "eaglelab.vllm_cpu_connector"} <= set(
        stage_code.closure("eaglelab.stages.serve"))
    # pilot runs prepare, extract, vocab and train as children
    assert {"eaglelab.stages.prepare", "eaglelab.stages.extract", "eaglelab.stages.vocab", "eaglelab.stages.train",
            "eaglelab.stages.acceptance"} <= set(stage_code.closure("eaglelab.stages.pilot"))
    for stage in ("train", "serve", "pilot", "synth", "extract"):
        assert not [m for m in stage_code.closure(f"eaglelab.stages.{stage}")
                    if m.startswith(("eaglelab.control", "eaglelab.eta"))], stage


PIPELINE = """\
stages:
  prepare:
    host: local
    command: ["${python}", "-m", "eaglelab.stages.prepare", "--out", "x"]
  train:
    host: local
    command: ["${python}", "-m", "eaglelab.stages.train", "--out", "y"]
"""


@pytest.fixture
def lab_on_a_copy(tmplab, tmp_path):
    """A Lab whose fingerprints hash a copy of the package, each job recorded as completed with the
    fingerprint it has now."""
    code = tmp_path / "code"
    shutil.copytree(stage_code.SOURCE_ROOT / "eaglelab", code / "eaglelab",
                    ignore=shutil.ignore_patterns("__pycache__"))
    tmplab.write_pipeline(PIPELINE)
    lab = Lab.load(str(tmplab.conf))
    lab.code_root = code
    for n, name in enumerate(("prepare", "train")):
        lab.registry.upsert({"id": f"{name}-1", "stage": name, "host": "local", "state": "completed", "exit_code": 0,
                             "fingerprint": lab.fingerprint(lab.cfg.stage(name)),
                             "started_at": f"2026-12-01T0{n}:00:00Z", "ended_at": f"2026-12-01T0{n}:30:00Z"})
    return lab, code / "eaglelab"


def plan_of(lab) -> dict[str, tuple[str, str]]:
    return {s.stage: (s.action, s.reason) for s in make_plan(lab, refresh=False)}


def test_a_change_in_a_module_train_imports_reruns_train_only(lab_on_a_copy):
    lab, pkg = lab_on_a_copy
    assert {s: a for s, (a, _) in plan_of(lab).items()} == {"prepare": "skip", "train": "skip"}
    with open(pkg / "eta" / "replay.py", "a") as f:  # no stage imports it
        f.write("\n# a change no stage runs\n")
    with open(pkg / "control" / "notify.py", "a") as f:
        f.write("\n# nor this one\n")
    assert {s: a for s, (a, _) in plan_of(lab).items()} == {"prepare": "skip", "train": "skip"}
    with open(pkg / "stages" / "acceptance.py", "a") as f:  # train imports it inside a function
        f.write("\n# train measures acceptance differently now\n")
    plan = plan_of(lab)
    assert plan["train"] == ("run", "inputs, config or code changed since train-1"), plan
    assert plan["prepare"][0] == "skip", plan


def test_a_change_in_a_module_every_stage_imports_reruns_both(lab_on_a_copy):
    lab, pkg = lab_on_a_copy
    with open(pkg / "manifest.py", "a") as f:
        f.write("\n# manifests read differently\n")
    assert {s: a for s, (a, _) in plan_of(lab).items()} == {"prepare": "run", "train": "run"}


def test_synth_does_not_follow_the_evals_code():
    """Synth reads vLLM's spec counters from their own module: an edit to the eval (its output probe, its
    verdict) must not mark hours of synth stale (stop 40 found synth's closure reaching the probe)."""
    from eaglelab.control import stage_code

    synth = stage_code.closure("eaglelab.stages.synth")
    assert "eaglelab.stages.spec_metrics" in synth
    assert not {"eaglelab.stages.eval", "eaglelab.stages.output_probe", "eaglelab.stages.eval_bench"} & set(synth)
