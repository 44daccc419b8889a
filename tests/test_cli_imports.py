"""`lab status --json` is what tests, cron and scripts call most: it imports what it uses and no
more (issue 31, item 7; the CPU figure is bench/bench_status_cpu.py's). The other commands' modules
are found by name (control/commands/INDEX), and each command still answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from eaglelab.control import commands

ROOT = Path(__file__).resolve().parents[1]
# What a status never needs: the estimator's numpy, the terminal's rich, cron's croniter, the
# page's flask/waitress, a launch's filelock, a webhook's urllib.request.
HEAVY = ["numpy", "rich", "croniter", "flask", "waitress", "filelock", "urllib.request"]


def test_the_index_names_every_command_of_every_module_and_no_other():
    found = {c.name: m for m in {*commands.INDEX.values()}
             for c in __import__(f"eaglelab.control.commands.{m}", fromlist=["COMMANDS"]).COMMANDS}
    assert {c.name for c in commands.all_commands()} == set(found)
    assert commands.INDEX == found
    assert all(commands.command(name).name == name for name in commands.INDEX)
    assert commands.command("nope") is None


def test_status_json_imports_none_of_the_heavy_modules(tmp_path):
    (tmp_path / "lab.yaml").write_text(f"profile: none\nlogs_dir: {tmp_path / 'logs'}\nhosts:\n  local:\n"
                                       f"    reach: local\n    work_dir: {tmp_path / 'work'}\n")
    (tmp_path / "pipeline.yaml").write_text("stages:\n  a:\n    host: local\n    command: ['true']\n")
    code = ("import json, sys\n"
            "from eaglelab.control import cli\n"
            "try:\n    cli.main()\nexcept SystemExit as e:\n    rc = e.code\n"
            f"print(json.dumps({{'rc': rc, 'loaded': [m for m in {HEAVY!r} if m in sys.modules]}}))\n")
    for args in (["status", "--json"], ["status", "--json", "--no-refresh"]):
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                           env={"PYTHONPATH": str(ROOT / "py"), "PATH": "/usr/bin:/bin", "EAGLELAB_CONF": str(tmp_path)})
        out = p.stdout.strip().splitlines()
        assert p.returncode == 0 and out, p.stderr[-2000:]
        status, verdict = json.loads("\n".join(out[:-1])), json.loads(out[-1])
        assert status["schema"] == 1 and [s["name"] for s in status["stages"]] == ["a"]
        assert verdict == {"rc": 0, "loaded": []}, f"lab {' '.join(args)} imported {verdict['loaded']}"


def test_every_command_is_listed_and_answers_help():
    listed = subprocess.run([str(ROOT / "bin" / "lab"), "--help"], capture_output=True, text=True).stdout
    for name in commands.INDEX:
        assert f"  {name} " in listed, name
    p = subprocess.run([str(ROOT / "bin" / "lab"), "cron", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "install" in p.stdout
