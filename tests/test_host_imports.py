"""The host side runs in whatever venv a host has: a host made from a small lock (tests/test_ssh_sync)
or an old one must still answer `python -m eaglelab.host.hostside`. So nothing under eaglelab.host
may import the controller's libraries (click, pydantic, flask, rich) at import time."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST_MODULES = ["eaglelab.host.hostside", "eaglelab.host.jobwrap", "eaglelab.host.hostfacts",
                "eaglelab.host.slurmside", "eaglelab.host.orphan", "eaglelab.host.tail.run", "eaglelab.host.tail.whole",
                "eaglelab.host.parse.state"]
CONTROLLER_ONLY = ["click", "pydantic", "flask", "rich", "waitress", "eaglelab.control"]


def test_host_side_imports_without_the_controllers_libraries():
    code = ("import sys\n"
            f"for m in {CONTROLLER_ONLY!r}: sys.modules[m] = None  # any import of it fails\n"
            f"import importlib\nfor m in {HOST_MODULES!r}: importlib.import_module(m)\n"
            "print('ok')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT / "py"), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_hostside_as_a_program_answers_the_slurm_verbs_too(tmp_path):
    """`python -m eaglelab.host.hostside` is what the controller runs over ssh, on a Slurm login node too."""
    def hostside(verb: str, args: str = "{}") -> dict:
        p = subprocess.run([sys.executable, "-m", "eaglelab.host.hostside", verb, "-"], input=args,
                           capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "py"), "PATH": "/usr/bin:/bin"})
        return json.loads(p.stdout)
    usage = hostside("nope")["error"]
    for verb in ("launch", "report", "slurm_submit", "slurm_report", "slurm_stop", "slurm_facts"):
        assert verb in usage
    got = hostside("slurm_report", json.dumps({"work_dir": str(tmp_path)}))  # slurmside's report, not a usage
    assert got["runs"] == [] and "slurm_error" in got, got


def test_a_log_whose_bars_all_finished_parses_without_numpy(tmp_path):
    """numpy (the estimator's) costs a cold `lab parse` ~0.1 CPU s (its import, OpenBLAS's threads):
    a server log whose only bar, the weight loading, finished long ago has no ETA to estimate."""
    log = tmp_path / "server.log"
    log.write_text("INFO 12-04 04:00:00 [loader.py:1] Starting to load model tiny...\n"
                   "\rLoading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]"
                   "\rLoading safetensors checkpoint shards: 100% Completed | 2/2 [00:04<00:00,  2.00s/it]\n"
                   "INFO 12-04 04:00:10 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000\n")
    code = ("import sys, json\nfrom eaglelab.host.tail.whole import parse_file\n"
            f"s = parse_file({str(log)!r})\n"
            "print(json.dumps([s['progress']['n'], s['progress']['eta_s'], 'numpy' in sys.modules]))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT / "py"), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout) == [2, 0, False]
    # and one still running does load it, for its ETA
    log.write_text(log.read_text().replace("2/2 [00:04<00:00", "1/2 [00:02<00:02"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT / "py"), "PATH": "/usr/bin:/bin"})
    n, eta, numpy_loaded = json.loads(p.stdout)
    assert n == 1 and eta and numpy_loaded
