"""Shared fixtures. `tmplab` builds a throw-away lab (its own conf, registry and run directories)
that drives the real `bin/lab` in subprocesses, the way a user does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest_plugins = ["suite_plan"]  # xdist groups, longest first; the time by file at the end

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "bin" / "lab"

# Started in the background of a non-interactive shell (`make test &`, a CI runner), this process and
# every `lab` it starts would inherit SIGINT ignored, and the tests of what a Ctrl-C does would test
# nothing (they failed that way: ci10). A handler here is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def poll(pred, timeout: float, interval: float = 0.2):
    """pred()'s first true value within timeout seconds, else None (the caller says what failed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    return None


def wait_for(pred, timeout: float = 60, interval: float = 0.2):
    """Poll pred() until it returns something true (returned) or fail after timeout seconds."""
    value = poll(pred, timeout, interval)
    if not value:
        raise AssertionError(f"condition not met within {timeout} s")
    return value


def remove_dead_faketime_files() -> None:
    """libfaketime (Debian's 0.9.10, preloaded by the cron and clock tests) keeps its clock in /dev/shm
    under the pid it started in, and leaves it there when that process ends, normally or by a signal.
    pid_max is 32768 here, so pids come round within a suite, and the files pile up across runs on one
    machine: a later process given such a pid opens them again, a semaphore perhaps still taken by the
    process that died. The files of processes that are gone are removed."""
    for f in Path("/dev/shm").glob("*faketime_*"):
        pid = f.name.rsplit("_", 1)[-1]
        if pid.isdigit() and not Path("/proc", pid).exists():
            f.unlink(missing_ok=True)


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 512 KiB tmpfs (a disk that fills up), mounted for the test and unmounted after it."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill_disk(path: Path) -> None:
    """Write zeros to path until its filesystem has no room left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def kill_unfinished(run_dirs) -> None:
    """SIGKILL the process group of every run without an exit.json: no stage outlives its test."""
    for d in run_dirs:
        meta = d / "meta.json"
        if meta.exists() and not (d / "exit.json").exists():
            pgid = json.loads(meta.read_text()).get("pgid")
            if pgid:
                try:
                    os.killpg(pgid, 9)
                except (ProcessLookupError, PermissionError):
                    pass


class TmpLab:
    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "conf"
        self.logs = root / "logs"
        self.work = root / "work"
        (self.conf / "profiles").mkdir(parents=True)
        self.write_lab()
        self.write_profile("test", "vars: {}\n")

    def write_lab(self, extra: str = "") -> None:
        (self.conf / "lab.yaml").write_text(textwrap.dedent(f"""\
            profile: test
            logs_dir: {self.logs}
            hosts:
              local:
                reach: local
                work_dir: {self.work}
                repo_dir: {REPO}
                python: {sys.executable}
            """) + extra)

    def write_pipeline(self, text: str) -> None:
        (self.conf / "pipeline.yaml").write_text(textwrap.dedent(text))

    def write_profile(self, name: str, text: str) -> None:
        (self.conf / "profiles" / f"{name}.yaml").write_text(textwrap.dedent(text))

    def env(self) -> dict:
        env = dict(os.environ)
        env["EAGLELAB_CONF"] = str(self.conf)
        env.pop("EAGLELAB_PROFILE", None)
        return env

    def lab(self, *args: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        p = subprocess.run([str(LAB), *args], capture_output=True, text=True, env=self.env(), timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise AssertionError(f"lab {' '.join(args)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def status(self) -> dict:
        return json.loads(self.lab("status", "--json").stdout)

    def runs(self, stage: str | None = None) -> list[dict]:
        return [r for r in self.status()["runs"] if stage is None or r["stage"] == stage]

    def wait_for(self, pred, timeout: float = 60, interval: float = 0.2):
        return wait_for(pred, timeout, interval)

    def run_dirs(self) -> list[Path]:
        d = self.work / "runs"
        return sorted(p for p in d.iterdir()) if d.exists() else []


@pytest.fixture
def tmplab(tmp_path: Path) -> TmpLab:
    lab = TmpLab(tmp_path)
    yield lab
    kill_unfinished(lab.run_dirs())


# -- the ssh lab: hosts as network namespaces with their own sshd (tests/testlab.py) -------------

@pytest.fixture(scope="session")
def netlab(tmp_path_factory):
    """Three real hosts h1 h2 h3 (namespaces + sshd), shared by the session's ssh tests."""
    from testlab import TestLab
    lab = TestLab(tmp_path_factory.mktemp("netlab"), hosts=3).start()
    yield lab
    lab.stop()


@pytest.fixture
def sshlab(netlab, tmp_path):
    """A throw-away lab config over the netlab hosts; runs left behind are killed afterwards."""
    from testlab import SshLab
    lab = SshLab(netlab, tmp_path)
    yield lab
    lab.cleanup()


# -- the tiny training set and drafter: made once a session, read by several files -----------------
# (test_acceptance, test_serve_smoke, test_multigpu: one xdist group in tests/suite_plan.py, so one
# worker makes them once; no test writes into them: tests that damage a checkpoint copy it first)

@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict[str, Path]:
    """model, prepared, hidden_states, vocab (+ root, eval prompts): the tiny target's own greedy
    answers to 16 prompts (64 new tokens), through prepare, extract (transformers) and vocab."""
    import foresight_data
    root = tmp_path_factory.mktemp("tiny_data")
    return {**foresight_data.build(root, num_prompts=16, max_new=64), "root": root, "prompts": root / "eval.jsonl"}


@pytest.fixture(scope="session")
def tiny_drafter(tiny_data, tmp_path_factory) -> dict:
    """A drafter the train stage trained on tiny_data for 2 epochs (checkpoints 0 and 1), with the
    offline acceptance estimate (k = 3) after each; "ck" is its directory, "log" the stage's output."""
    import foresight_data
    ck = tmp_path_factory.mktemp("tiny_drafter") / "ck"
    log = foresight_data.run_stage(
        "train", "--model", str(tiny_data["model"]), "--data", str(tiny_data["prepared"]),
        "--hidden-states", str(tiny_data["hidden_states"]), "--vocab", str(tiny_data["vocab"]), "--out", str(ck),
        "--aux-layers", foresight_data.AUX, "--draft-vocab-size", foresight_data.DRAFT_VOCAB, "--epochs", "2",
        "--lr", "3e-3", "--loss-fn", "ce", "--total-seq-len", "1024", "--device", "cpu", "--acceptance-k", "3")
    return {**tiny_data, "ck": ck, "log": log}
