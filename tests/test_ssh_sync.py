"""`lab sync HOST`: the project goes to the host and its venv is made from the lock; preflight sees
the host's environment drift from the lock and names the package; a sync puts it right.

The hosts have no network: the test builds two versions of a tiny wheel itself and the host's pip
installs from that wheelhouse (`pip_options: [--no-index, --find-links, DIR]`, as a lab with a
private mirror would configure it)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
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


# -- a host without a package index: the wheelhouse ------------------------------------------------

WHEELHOUSE_LOCK = "blinker==1.9.0\nsix==1.17.0\nmarkupsafe==3.0.3\n"  # two pure-python wheels, one built for the platform


def test_sync_with_a_wheelhouse_built_here_for_the_hosts_platform(sshlab, tmp_path: Path):
    """`lab wheelhouse h2` downloads the lock's wheels on the controller for h2's platform (asked of
    h2's python: markupsafe is a cp311 manylinux wheel), cached by the lock's digest; `lab sync h2
    --wheelhouse` copies them into h2's own home and installs from them alone (no index, h2's pip
    configuration not read)."""
    from eaglelab.control.transfers.wheelhouse import PLATFORM_SCRIPT, target_from_facts
    lock = tmp_path / "wh.lock"
    lock.write_text(WHEELHOUSE_LOCK)
    base_python = getattr(sys, "_base_executable", None) or "python3"
    script = "import blinker, six, markupsafe; print('imported', six.__version__, markupsafe.escape('<x>'))"
    sshlab.write({"use": {"host": "h2", "command": ["${python}", "-c", script]}}, hosts=["h2"], lock=str(lock),
                 extra_host={"repo_dir": "~/eaglelab-wheelhouse", "python": ".venv/bin/python",
                             "base_python": base_python})
    home = sshlab.net.home("h2")

    built = sshlab.lab("wheelhouse", "h2", timeout=300)
    cache = sshlab.logs / "wheelhouse"
    (wh,) = [d for d in cache.iterdir() if d.is_dir()]
    facts = json.loads(subprocess.run([base_python, "-c", PLATFORM_SCRIPT], capture_output=True, text=True).stdout)
    assert wh.name.endswith(target_from_facts(facts).key()), wh.name
    wheels = sorted(p.name for p in wh.glob("*.whl"))
    assert len(wheels) == 3 and any(w.startswith("markupsafe-3.0.3-cp311-") and "manylinux" in w for w in wheels), wheels
    assert "3 wheels" in built.stdout and "downloaded in" in built.stdout
    manifest = (wh / "wheelhouse.json").read_text()
    again = sshlab.lab("wheelhouse", "h2", timeout=120)
    assert "(cached)" in again.stdout and (wh / "wheelhouse.json").read_text() == manifest

    out = sshlab.lab("sync", "h2", "--wheelhouse", timeout=300).stdout
    assert "(cached)" in out and "h2 done" in out, out
    copied = home / "eaglelab-wheelhouse" / ".eaglelab" / "wheelhouse" / wh.name
    assert sorted(p.name for p in copied.glob("*.whl")) == wheels  # on the host's own disk
    checks = preflight_checks(sshlab, "use")
    assert all(c["verdict"] == "PASS" for c in checks.values()), checks
    sshlab.lab("run", "use", "--quiet")
    (run_id,) = host_run_ids(sshlab, "h2")
    assert b"imported 1.17.0 &lt;x&gt;" in (sshlab.run_dir("h2", run_id) / "output.log").read_bytes()

    # a changed lock is another wheelhouse; a pin with no wheel for the platform is named
    lock.write_text(WHEELHOUSE_LOCK + "markupsafe-missing-pkg==0.0.1\n")
    bad = sshlab.lab("wheelhouse", "h2", check=False, timeout=300)
    assert bad.returncode != 0 and "markupsafe-missing-pkg" in bad.stderr and "pip download" in bad.stderr
    assert [d.name for d in cache.iterdir()] == [wh.name]  # nothing half-made left behind


def test_a_wheelhouse_for_a_platform_given_by_options_asks_no_host(sshlab, tmp_path: Path):
    lock = tmp_path / "pure.lock"
    lock.write_text("six==1.17.0\n")
    sshlab.write({"use": {"host": "h1", "command": ["true"]}}, hosts=["h1"], lock=str(lock),
                 extra_host={"ssh": {"host": "h1", "config_file": "/nonexistent/ssh_config"}})
    out = sshlab.lab("wheelhouse", "h1", "--platform", "manylinux_2_28_aarch64", "--python-version", "3.12",
                     timeout=300).stdout
    assert "cp312-manylinux_2_28_aarch64" in out and "1 wheels" in out
    refused = sshlab.lab("wheelhouse", "h1", "--platform", "manylinux_2_28_aarch64", check=False)
    assert refused.returncode != 0 and "--python-version" in refused.stderr


def test_the_tags_of_a_hosts_platform():
    from eaglelab.control.transfers.wheelhouse import target_from_facts
    t = target_from_facts({"implementation": "cpython", "python_version": "3.12", "abiflags": "", "machine": "aarch64",
                           "system": "linux", "libc": "glibc", "libc_version": "2.28"})
    assert t.platforms[0] == "manylinux_2_28_aarch64" and "manylinux2014_aarch64" in t.platforms
    assert t.platforms[-1] == "linux_aarch64" and "manylinux_2_29_aarch64" not in t.platforms
    assert t.abis == ("cp312",) and t.key() == "cp312-manylinux_2_28_aarch64"
    args = t.pip_args()
    assert args[:2] == ["--platform", "manylinux_2_28_aarch64"] and ["--python-version", "3.12"] == \
        args[args.index("--python-version"):args.index("--python-version") + 2]


def test_a_hosts_platform_answer_never_names_a_folder_outside_the_wheelhouse(sshlab, tmp_path: Path):
    """O-6: the host's python answers the platform; its fields become folder names here (the cache
    under logs/wheelhouse) and on the host (rsync's destination). A hostile or broken answer
    (`machine: x86_64/../../../../victim`) is refused naming the host and the field; nothing is made
    or deleted outside the wheelhouse, on either side."""
    lock = tmp_path / "pure.lock"
    lock.write_text("six==1.17.0\n")
    evil = tmp_path / "evil-python"  # the host's base_python: the filesystem is shared, homes are not
    evil.write_text("#!/bin/sh\necho '" + json.dumps({
        "implementation": "cpython", "python_version": "3.11", "abiflags": "", "soabi": "cpython-311",
        "machine": "x86_64/../../../../victim", "system": "linux", "libc": "glibc", "libc_version": "2.35"}) + "'\n")
    evil.chmod(0o755)
    sshlab.write({"use": {"host": "h1", "command": ["true"]}}, hosts=["h1"], lock=str(lock),
                 extra_host={"repo_dir": "~/eaglelab-o6", "python": ".venv/bin/python", "base_python": str(evil)})
    before = sorted(p.name for p in sshlab.logs.parent.parent.iterdir())
    for argv in (["wheelhouse", "h1"], ["sync", "h1", "--wheelhouse"]):
        r = sshlab.lab(*argv, check=False, timeout=120)
        assert r.returncode != 0 and "host 'h1'" in r.stderr and "'machine'" in r.stderr \
            and "x86_64/../../../../victim" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not list((sshlab.logs / "wheelhouse").glob("*")) if (sshlab.logs / "wheelhouse").exists() else True
    assert sorted(p.name for p in sshlab.logs.parent.parent.iterdir()) == before  # no victim.tmp-* beside it
    assert not (sshlab.net.home("h1") / "eaglelab-o6" / ".eaglelab").exists()
    refused = sshlab.lab("wheelhouse", "h1", "--platform", "../../x", "--python-version", "3.12", check=False)
    assert refused.returncode != 0 and "--platform" in refused.stderr and "Traceback" not in refused.stderr


def test_a_facts_answer_without_home_is_an_error_not_a_traceback(sshlab, tmp_path: Path):
    """O-13: a host whose hostside answers facts without `home` (an older or broken install) made
    a host path (the repo, an input's size for a `prior:`) end in a KeyError traceback; now a
    HostError (shown without a traceback) names the host and the fix."""
    fake = tmp_path / "old-python"  # the host's python: answers every hostside verb as an old one did
    fake.write_text("#!/bin/sh\necho '{\"schema\": 1, \"hostname\": \"h1\"}'\n")
    fake.chmod(0o755)
    sshlab.write({"use": {"host": "h1", "command": ["true"]}}, hosts=["h1"],
                 extra_host={"python": str(fake), "repo_dir": "~/eaglelab-old"})
    from eaglelab.errors import HostError
    ex = sshlab.core().executor("h1")  # as `lab status` reaches it for a stage's `prior:` (its input's path)
    try:
        ex.repo_dir()
        raise AssertionError("a host path was made without the host's home")
    except HostError as e:
        assert "host 'h1'" in str(e) and "home" in str(e) and "lab sync h1" in str(e), e
