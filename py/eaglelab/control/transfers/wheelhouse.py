"""`lab wheelhouse HOST`: the wheels of a host's lock, downloaded on the controller for the host's
platform. GPU hosts often have no package index (no internet, no mirror); `lab sync HOST
--wheelhouse` copies these wheels there (rsync) and installs from them alone (`pip --no-index
--find-links`).

The platform is the host's: its python is asked, in one ssh call, for its implementation, version,
ABI, machine and C library (or options give them, and the host is not asked). The wheels are
`pip download --only-binary=:all: --no-deps` of the lock's exact pins with those tags, cached under
the logs dir by the lock's digest and the platform: a second sync downloads nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from eaglelab.errors import HostError
from eaglelab.fsutil import utcnow_iso

# Run by the host's python (the venv's when it exists, else base_python): standard library only.
PLATFORM_SCRIPT = """\
import json, platform, sys, sysconfig
v = sys.version_info
libc, libc_version = platform.libc_ver()
print(json.dumps({"implementation": sys.implementation.name, "python_version": f"{v.major}.{v.minor}",
                  "abiflags": getattr(sys, "abiflags", ""), "soabi": sysconfig.get_config_var("SOABI"),
                  "machine": platform.machine(), "system": sys.platform, "libc": libc,
                  "libc_version": libc_version}))
"""

IMPLEMENTATIONS = {"cpython": "cp", "pypy": "pp"}
# What a wheel tag's parts are made of (PEP 425/600): the host's answer becomes folder names on the
# controller and on the host, so "x86_64/../../home" must never reach a path.
TAG_PART = re.compile(r"[A-Za-z0-9_.]{1,64}")
PYTHON_VERSION = re.compile(r"\d{1,2}\.\d{1,3}")
SOABI = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # cpython-311-x86_64-linux-gnu
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
MANIFEST = "wheelhouse.json"


@dataclass(frozen=True)
class Target:
    """The interpreter the wheels are for, as pip download's tag options say it."""
    platforms: tuple[str, ...]  # most specific first
    python_version: str  # "3.11"
    implementation: str  # "cp"
    abis: tuple[str, ...]  # "cp311" (pip adds abi3 and none for CPython)

    def pip_args(self) -> list[str]:
        args = [a for p in self.platforms for a in ("--platform", p)]
        args += ["--python-version", self.python_version, "--implementation", self.implementation]
        return args + [a for abi in self.abis for a in ("--abi", abi)]

    def key(self) -> str:
        """A folder name: the ABI and the most specific platform (`cp311-manylinux_2_35_x86_64`)."""
        return f"{self.abis[0] if self.abis else self.implementation}-{self.platforms[0]}"


def _plain(value: str, pattern: re.Pattern, what: str, fix: str) -> str:
    """A tag part as it may enter a folder name: letters, digits, `_` and `.`, never `..`."""
    if not pattern.fullmatch(value) or ".." in value:
        raise HostError(f"{what} is {value[:120]!r}: not a wheel tag part (letters, digits, '_' and '.' only); "
                        f"{fix}")
    return value


def _checked_facts(f: dict, host: str) -> dict:
    """The facts that become tags and folder names, each a plain tag part (a hostile or broken host's
    python could answer anything)."""
    if not isinstance(f, dict):
        raise HostError(f"host {host!r}: its python answered {str(f)[:200]!r}, not the platform JSON object")
    fix = f"check the host's python (hosts.{host}.base_python), or give --platform and --python-version"
    out = {}
    for key in ("implementation", "python_version", "abiflags", "soabi", "machine", "system", "libc", "libc_version"):
        value = f.get(key)
        if value in (None, ""):
            out[key] = value
            continue
        pattern = PYTHON_VERSION if key == "python_version" else SOABI if key == "soabi" else TAG_PART
        out[key] = _plain(str(value), pattern, f"host {host!r}: its platform answer {key!r}", fix)
    if out.get("libc_version") and not re.fullmatch(r"\d+\.\d+(\.\d+)?", out["libc_version"]):
        raise HostError(f"host {host!r}: its platform answer 'libc_version' is {out['libc_version']!r}, not N.N; {fix}")
    return out


def target_from_facts(f: dict, host: str = "NAME") -> Target:
    """The pip tags of the interpreter PLATFORM_SCRIPT described: every manylinux level its glibc
    runs (newest first, the legacy names too), then plain linux_<machine>."""
    f = _checked_facts(f, host)
    impl = IMPLEMENTATIONS.get(f.get("implementation"), f.get("implementation") or "cp")
    version = str(f.get("python_version") or "")
    machine = f.get("machine") or ""
    if not version or not machine:
        raise HostError(f"the host's python did not say its version and machine ({f}); give --python-version "
                        f"and --platform")
    if not str(f.get("system", "")).startswith("linux"):
        raise HostError(f"the host is {f.get('system')!r}, not Linux: give its wheel platforms with --platform "
                        f"(e.g. macosx_14_0_arm64)")
    platforms: list[str] = []
    if f.get("libc") == "glibc" and f.get("libc_version"):
        major, minor = (int(x) for x in str(f["libc_version"]).split(".")[:2])
        for m in range(minor, 4, -1):
            platforms.append(f"manylinux_{major}_{m}_{machine}")
            if major == 2 and m in LEGACY_MANYLINUX:
                platforms.append(f"{LEGACY_MANYLINUX[m]}_{machine}")
    platforms.append(f"linux_{machine}")
    if impl == "cp":
        abis = (f"cp{version.replace('.', '')}{f.get('abiflags') or ''}",)
    else:  # PyPy and others: their SOABI's first two parts (pypy310-pp73-x86_64-linux-gnu -> pypy310_pp73)
        soabi = str(f.get("soabi") or "")
        abis = ("_".join(soabi.split("-")[:2]),) if soabi else ()
    return Target(tuple(platforms), version, impl, abis)


def target_from_options(platforms: tuple[str, ...], python_version: str, implementation: str | None,
                        abis: tuple[str, ...]) -> Target:
    for value, option in [*((p, "--platform") for p in platforms), (python_version, "--python-version"),
                          (implementation or "cp", "--implementation"), *((a, "--abi") for a in abis)]:
        _plain(value, PYTHON_VERSION if option == "--python-version" else TAG_PART, option,
               "e.g. --platform manylinux_2_28_x86_64 --python-version 3.12")
    impl = implementation or "cp"
    abis = abis or ((f"cp{python_version.replace('.', '')}",) if impl == "cp" else ())
    return Target(tuple(platforms), python_version, impl, tuple(abis))


def host_facts(ex, venv_python: str) -> dict:
    """PLATFORM_SCRIPT run on the host by the python the venv has (or will be made with)."""
    base = ex.host.base_python
    script = shlex.quote(PLATFORM_SCRIPT)
    # `if [ -x VENV_PY ]; then VENV_PY -c S; else BASE -c S; fi`, every part quoted
    remote = (f"if {shlex.join(['test', '-x', venv_python])}; then {shlex.quote(venv_python)} -c {script}; "
              f"else {shlex.quote(base)} -c {script}; fi")
    cp = ex.run_ssh(remote)
    text = (cp.stdout or b"").decode(errors="replace").strip()
    if cp.returncode != 0 or not text:
        raise HostError(f"host {ex.host.name!r}: asking its python ({base}) for its platform failed (rc "
                        f"{cp.returncode}): {(cp.stderr or b'').decode(errors='replace').strip()[-400:]}; "
                        f"check hosts.{ex.host.name}.base_python, or give --platform and --python-version")
    try:
        return json.loads(text.splitlines()[-1])
    except ValueError:
        raise HostError(f"host {ex.host.name!r}: its python answered {text[-200:]!r}, not the platform JSON") from None


def lock_digest(lock: Path) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:16]


def cache_dir(logs_dir: Path, lock: Path, target: Target) -> Path:
    """logs/wheelhouse/<lock digest>-<key>: one folder right inside the wheelhouse, whatever the tags."""
    name = f"{lock_digest(lock)}-{target.key()}"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", name) or ".." in name:
        raise HostError(f"wheelhouse folder {name!r} is not a plain name: the platform tags {target.key()!r} "
                        f"hold characters no wheel tag has")
    return Path(logs_dir) / "wheelhouse" / name


def build(lock: Path, target: Target, logs_dir: Path, out=None, timeout_s: float = 3600) -> dict:
    """The wheelhouse of lock for target (downloaded, or the cached one): its manifest, with `dir`."""
    dest = cache_dir(logs_dir, lock, target)
    manifest = dest / MANIFEST
    if manifest.is_file():
        info = json.loads(manifest.read_text())
        info.update(dir=str(dest), cached=True)
        return info
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    argv = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--no-deps", "--disable-pip-version-check",
            "-q", "--dest", str(tmp), *target.pip_args(), "-r", str(lock)]
    if out is not None:
        print(f"lab wheelhouse: downloading {lock.name} for {target.key()} into {dest}", file=out, flush=True)
    t0 = time.monotonic()
    try:
        cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        raise HostError(f"pip download of {lock} did not finish within {timeout_s:.0f} s") from None
    took = time.monotonic() - t0
    if cp.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise HostError(f"pip download of {lock} for {target.key()} failed (rc {cp.returncode}): "
                        f"{cp.stderr.strip()[-800:]} — a pin without a wheel for this platform needs another "
                        f"version in the lock, or a wheel you build yourself put in the lab's index")
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    info = {"schema": 1, "lock": str(lock), "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
            "target": {"platforms": list(target.platforms), "python_version": target.python_version,
                       "implementation": target.implementation, "abis": list(target.abis)},
            "files": files, "bytes": sum(files.values()), "built_at": utcnow_iso(), "took_s": round(took, 3)}
    (tmp / MANIFEST).write_text(json.dumps(info, indent=1))
    try:
        os.rename(tmp, dest)  # whole or not at all; a concurrent build that won is as good
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not manifest.is_file():
            raise
    info = json.loads(manifest.read_text())
    info.update(dir=str(dest), cached=False)
    return info


def describe(info: dict) -> str:
    how = "cached" if info.get("cached") else f"downloaded in {info.get('took_s', 0):.1f} s"
    return f"wheelhouse {info['dir']}: {len(info['files'])} wheels, {info['bytes']:,} B ({how})"
