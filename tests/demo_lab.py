"""A throw-away lab on the demo profile (the real conf/pipeline.yaml and demo.yaml, data in a temp
directory, its own ports), driven through the real `bin/lab`: what the demo-level tests run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "bin" / "lab"


class Lab:
    def __init__(self, root: Path, vars_: dict | None = None, ports: tuple[int, int, int] = (8210, 8211, 8212),
                 drop_stages: tuple[str, ...] = (), samples: int = 64, lab_extra: dict | None = None,
                 env: dict | None = None):
        self.root, self.conf, self.data = root, root / "conf", root / "data"
        (self.conf / "profiles").mkdir(parents=True)
        (self.conf / "lab.yaml").write_text(yaml.safe_dump({
            "profile": "e2e", "logs_dir": str(root / "logs"),
            "hosts": {"local": {"reach": "local", "work_dir": str(root / "work"), "repo_dir": str(REPO),
                                "python": sys.executable, "gpus": 0}}, **(lab_extra or {})}))
        pipe = yaml.safe_load((REPO / "conf" / "pipeline.yaml").read_text())
        prof = yaml.safe_load((REPO / "conf" / "profiles" / "demo.yaml").read_text())
        for name in drop_stages:  # a shorter pipeline: these stages (and the profile's words on them) go
            pipe["stages"].pop(name, None)
            prof.get("stages", {}).pop(name, None)
        (self.conf / "pipeline.yaml").write_text(yaml.safe_dump(pipe, sort_keys=False))
        prof["vars"].update({"data": str(self.data), "synth_limit": str(samples), "epochs": "3",
                             "extract_concurrency": "1", "port_target": str(ports[0]), "port_extract": str(ports[1]),
                             "port_eval": str(ports[2]), "eval_limit": "4", "eval_max_tokens": "32", **(vars_ or {})})
        assert prof["vars"]["eval_concurrency"] == "1 4" and prof["vars"]["eval_repeats"] == "2"  # the demo's sweep
        prof["env"] = {**prof.get("env", {}), **(env or {})}
        (self.conf / "profiles" / "e2e.yaml").write_text(yaml.safe_dump(prof))
        self.transcript: list[str] = []

    def lab(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        env = dict(os.environ, EAGLELAB_CONF=str(self.conf))
        env.pop("EAGLELAB_PROFILE", None)
        p = subprocess.run([str(LAB), *args], capture_output=True, text=True, env=env, timeout=timeout)
        self.transcript.append(f"$ lab {' '.join(args)} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        if check and p.returncode != 0:
            raise AssertionError(f"lab {' '.join(args)} -> {p.returncode}\n{p.stdout[-6000:]}\n{p.stderr[-3000:]}")
        return p

    def status_json(self) -> dict:
        return json.loads(self.lab("status", "--json").stdout)

    def popen(self, *args: str) -> tuple[subprocess.Popen, Path]:
        """`lab ARGS` in the background, its output into a file (a pipe nobody reads while it runs
        fills up and blocks it); (the process, that file)."""
        env = dict(os.environ, EAGLELAB_CONF=str(self.conf))
        env.pop("EAGLELAB_PROFILE", None)
        log = self.root / f"popen-{len(self.transcript)}-{int(time.time())}.log"
        with open(log, "wb") as f:
            proc = subprocess.Popen([str(LAB), *args], stdout=f, stderr=subprocess.STDOUT, env=env)
        self.transcript.append(f"$ lab {' '.join(args)} (background, output in {log})")
        return proc, log

    def wait_for(self, pred, timeout: float, what: str):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = pred()
            if v:
                return v
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")

    def wait_paused(self, stage: str, timeout: float) -> None:
        """Until a process of the running stage's group is stopped (SIGSTOP: state T in /proc)."""
        metas = sorted((self.root / "work" / "runs").glob(f"{stage}-*/meta.json"))
        pgid = json.loads(metas[-1].read_text())["pgid"]

        def stopped() -> bool:
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
                except OSError:
                    continue
                if fields[0] == "T" and int(fields[2]) == pgid:
                    return True
            return False

        self.wait_for(stopped, timeout, f"{stage} paused")

    def kill_stage(self, stage: str) -> None:
        """SIGKILL the running stage's process group at once (no grace), from its meta.json."""
        metas = sorted((self.root / "work" / "runs").glob(f"{stage}-*/meta.json"))
        pgid = json.loads(metas[-1].read_text())["pgid"]
        os.killpg(pgid, 9)
        self.wait_for(lambda: (metas[-1].parent / "exit.json").exists(), 60, f"{stage}'s exit.json")

    def teardown(self) -> None:
        for svc in ("serve_target", "serve_extract", "serve_eval", "extract", "train"):
            self.lab("stop", svc, check=False, timeout=120)


def snapshot(files) -> dict[str, tuple[int, int]]:
    return {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in files}
