"""`lab sync HOST`: the project goes to the host and its venv is made from the lock; preflight sees
the host's environment drift from the lock and names the package; a sync puts it right.

The hosts have no network: the test builds two versions of a tiny wheel itself and the host's pip
installs from that wheelhouse (`pip_options: [--no-index, --find-links, DIR]`, as a lab with a
private mirror would configure it)."""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import zipfile
from pathlib import Path

from test_ssh_lab import host_run_ids


def build_wheel(wheelhouse: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel (PEP 427) written by hand: no build backend, no network."""
    files = {f"{name}/__init__.py": f'VERSION = "{version}"\n',
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: eaglelab-tests\n"
                                                  "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    whl = wheelhouse / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return whl


def preflight_checks(sshlab, stage: str) -> dict[str, dict]:
    p = sshlab.lab("preflight", stage, "--json", check=False)
    return {c["name"]: c for c in json.loads(p.stdout)["checks"]}


def test_sync_makes_the_venv_from_the_lock_and_preflight_tracks_drift(sshlab, tmp_path: Path):
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "tinypkg", "1.0")
    build_wheel(wheels, "tinypkg", "1.1")
    lock = tmp_path / "small.lock"
    lock.write_text("tinypkg==1.0\n")
    base_python = getattr(sys, "_base_executable", None) or "python3"  # has ensurepip: venv works offline
    script = "import tinypkg; print('tinypkg', tinypkg.VERSION)"
    sshlab.write({"use": {"host": "h3", "command": ["${python}", "-c", script]}}, hosts=["h3"], lock=str(lock),
                 extra_host={"repo_dir": "~/eaglelab", "python": ".venv/bin/python", "base_python": base_python,
                             "pip_options": ["--no-index", "--find-links", str(wheels)]})
    home = sshlab.net.home("h3")

    # before: nothing on the host to run
    host = preflight_checks(sshlab, "use")["host"]
    assert host["verdict"] == "FAIL" and "lab sync h3" in host["detail"] + host["fix"]

    out = sshlab.lab("sync", "h3", timeout=300).stdout
    assert "h3 done" in out
    assert (home / "eaglelab" / "py" / "eaglelab" / "host" / "hostside.py").is_file()
    assert (home / "eaglelab" / "conf" / "lab.yaml").is_file() and not (home / "eaglelab" / ".git").exists()
    checks = preflight_checks(sshlab, "use")
    assert all(c["verdict"] == "PASS" for c in checks.values()), checks
    assert checks["host"]["detail"].count(str(home / "eaglelab" / ".venv" / "bin" / "python")) == 1

    # someone upgrades a package on the host by hand: preflight names it, with both versions
    pip = sshlab.net.ssh("h3", "eaglelab/.venv/bin/python", "-m", "pip", "install", "-q", "--no-index",
                         "--find-links", str(wheels), "tinypkg==1.1", timeout=120)
    assert pip.returncode == 0, pip.stderr
    env = preflight_checks(sshlab, "use")["env"]
    assert env["verdict"] == "FAIL" and "tinypkg (lock 1.0, host 1.1)" in env["detail"]
    assert sshlab.lab("run", "use", check=False).returncode == 1  # the launch is refused

    sshlab.lab("sync", "h3", timeout=300)  # puts the lock's version back
    assert preflight_checks(sshlab, "use")["env"]["verdict"] == "PASS"
    sshlab.lab("run", "use", "--quiet")
    (run_id,) = host_run_ids(sshlab, "h3")
    assert b"tinypkg 1.0" in (sshlab.run_dir("h3", run_id) / "output.log").read_bytes()
