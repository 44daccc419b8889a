"""The ssh command line and the log mirror, without a host: what exactly reaches the remote shell."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from eaglelab.config import HostConfig, SshConfig
from eaglelab.control.executors.ssh import SshExecutor, remote_rel
from eaglelab.control.transfers.mirror import LogMirror, safe_name
from eaglelab.errors import HostError

HOSTILE = ["; rm -rf /", "$(touch /tmp/x)", "`id`", "a'b", 'a"b', "\\", "*", "\n", "--", "-oProxyCommand=x"]


def executor(tmp_path: Path, **ssh) -> SshExecutor:
    host = HostConfig(name="gpu1", reach="ssh", ssh=SshConfig(host="gpu1", **ssh), repo_dir="~/eaglelab",
                      python=".venv/bin/python", work_dir="runs-data")
    return SshExecutor(host, logs_dir=tmp_path)


@pytest.mark.parametrize("value", HOSTILE)
def test_remote_command_is_one_quoted_argv(tmp_path, value):
    ex = executor(tmp_path)
    argv = shlex.split(ex.remote_command("launch"))  # what a POSIX shell on the host makes of it
    # the arguments (values of the config, a launch's env) go on stdin, never on a command line
    assert argv == ["env", "PYTHONPATH=eaglelab/py", "eaglelab/.venv/bin/python", "-m", "eaglelab.host.hostside",
                    "launch", "-"]


def test_ssh_options(tmp_path):
    ex = executor(tmp_path, user="alice", port=2222, options=["ProxyJump=bastion"], connect_timeout_s=3)
    argv = ex.ssh_argv()
    assert argv[:2] == ["ssh", "-T"] and "-t" not in argv
    joined = " ".join(argv)
    for opt in ("BatchMode=yes", "ConnectTimeout=3", "ServerAliveInterval=5", "ServerAliveCountMax=3",
                "ControlMaster=auto", "ControlPersist=300", "ProxyJump=bastion"):
        assert opt in joined
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "alice"
    assert "ControlPath=none" in " ".join(executor(tmp_path, multiplex=False).ssh_argv())


def test_control_path_is_short_and_per_lab(tmp_path):
    a, b = executor(tmp_path / "a"), executor(tmp_path / "b")
    assert a.control_path() != b.control_path()  # two labs with the same host never share a master
    deep = executor(tmp_path / ("d" * 120))
    assert len(deep.control_path()) <= 90  # sun_path limit: falls back to a short private dir


def test_a_destination_that_looks_like_an_option_is_refused(tmp_path):
    with pytest.raises(HostError, match="may not start with '-'"):
        SshExecutor(
            HostConfig(name="x", reach="ssh", ssh=SshConfig(host="-oProxyCommand=id")), logs_dir=tmp_path)


@pytest.mark.parametrize("path, expected", [("~/x/y", "x/y"), ("~", "."), ("/abs", "/abs"), ("rel", "rel")])
def test_remote_rel(path, expected):
    assert remote_rel(path) == expected


def test_paths_relative_to_repo_and_home(tmp_path):
    ex = executor(tmp_path)
    assert ex.work_dir == "eaglelab/runs-data"  # relative to the remote home, resolved there
    assert ex.remote_python == "eaglelab/.venv/bin/python"
    ex._home = "/home/alice"
    assert ex.repo_dir() == "/home/alice/eaglelab" and ex.python == "/home/alice/eaglelab/.venv/bin/python"
    assert ex.host_path("~/data") == "/home/alice/data" and ex.host_path("/d") == "/d"


def test_mirror_appends_only_what_continues_it(tmp_path):
    m = LogMirror(tmp_path)
    log = b"0123456789abcdef"
    assert m.offer("h", "r", 0, log[:4]) == 4
    assert m.offer("h", "r", 0, log[:4]) == 0  # the same bytes again: nothing doubled
    assert m.offer("h", "r", 2, log[2:8]) == 4  # an overlapping read: only the new tail
    assert m.offer("h", "r", 10, log[10:]) == 0  # a gap: refused (the next sync fills it in order)
    assert m.offer("h", "r", 8, log[8:]) == 8
    assert m.path("h", "r").read_bytes() == log and m.size("h", "r") == len(log)


def test_mirror_file_names_for_hostile_host_names(tmp_path):
    m = LogMirror(tmp_path)
    p = m.path("../../etc; rm -rf $(x)", "run-1")
    assert p.parent.parent == tmp_path and safe_name("ok-name.1") == "ok-name.1"
    assert safe_name("a/b") != safe_name("a_b")  # distinct names stay distinct


# -- where the ssh master sockets live ----------------------------------------------------------

def test_a_space_in_the_logs_path_stays_one_control_path(tmp_path):
    """ssh reads `-o` like a config line: unquoted, a space splits the path (every host read as
    unreachable). `ssh -G` prints the configuration ssh would use, without connecting."""
    import tempfile
    logs = Path(tempfile.mkdtemp(prefix="e l-"))  # short enough for a socket path, with a space
    ex = executor(logs)
    argv = ex.ssh_argv()
    import subprocess
    out = subprocess.run([*argv, "-G", "gpu1"], capture_output=True, text=True, timeout=20).stdout
    (line,) = [ln for ln in out.splitlines() if ln.startswith("controlpath ")]
    assert line == f"controlpath {ex.control_path()}" and " " in ex.control_path()


@pytest.mark.parametrize("how", ["loose", "someone_elses", "link"])
def test_a_control_socket_folder_others_could_use_is_never_used_a_private_one_is(tmp_path, how, monkeypatch, capfd):
    """The short folder is squatted (made first by another user, a link, 0777): it is never used,
    and (O-12) no host is cut either: a private folder of a random name is made and remembered in
    logs/, so the next `lab` process shares it; the squatted one is left as it was."""
    import os
    long_logs = tmp_path / ("x" * 120)  # too long for a socket path: the short private folder is used
    runtime = tmp_path / "run"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    d = runtime / "eaglelab-ssh"
    if how == "link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        d.symlink_to(tmp_path / "elsewhere")
    else:
        d.mkdir(mode=0o700)
        if how == "loose":
            d.chmod(0o777)
        else:
            os.chown(d, 65534, 65534)  # made first by another user (nobody)
    before = os.lstat(d)
    path = Path(executor(long_logs).control_path())
    chosen = path.parent
    assert chosen.parent == runtime and chosen != d and chosen.name.startswith(f"eaglelab-ssh-{os.getuid()}-")
    st = os.lstat(chosen)
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700 and not chosen.is_symlink()
    assert "not using" in capfd.readouterr().err and os.lstat(d) == before  # said once, the squat untouched
    assert Path(executor(long_logs).control_path()).parent == chosen  # the next process: the same one
    if how == "loose":
        d.chmod(0o700)
        assert executor(long_logs).control_path().startswith(str(d) + "/")  # ours and private: used


def test_the_fix_hint_is_the_ssh_line_that_would_work(tmp_path):
    ex = executor(tmp_path, user="alice", port=2222, config_file="/lab/ssh config")
    assert ex.try_command() == "ssh -F '/lab/ssh config' -p 2222 -l alice gpu1 true"
