"""The test lab itself: no packet to a test address leaves the machine, and teardown leaves nothing."""

from __future__ import annotations

import errno
import secrets
import socket
import subprocess

import pytest

from testlab import TestLab, add_netns, netns_lock, sh


def test_guard_route_keeps_test_addresses_off_the_real_network(netlab):
    route = subprocess.run(["ip", "route", "show", "10.77.0.0/24"], capture_output=True, text=True).stdout
    assert route.startswith("unreachable 10.77.0.0/24")
    s = socket.socket()
    s.settimeout(2)
    try:
        err = s.connect_ex(("10.77.0.11", 22))  # from the root namespace: refused at once, never routed out
    finally:
        s.close()
    assert err in (errno.EHOSTUNREACH, errno.ENETUNREACH)


def test_teardown_kills_every_process_and_namespace(tmp_path):
    lab = TestLab(tmp_path, hosts=1).start()
    sshd = lab.sshd["h1"]
    # a job started over ssh and detached from it, as jobwrap is: it must not survive the lab
    job = lab.ssh("h1", "setsid nohup sleep 300 > /dev/null 2>&1 < /dev/null & echo $!")
    pid = int(job.stdout)
    names = [lab.ctl, lab.ns("h1")]
    lab.stop()
    assert sshd.poll() is not None
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in netns for n in names)
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z")  # killed (a zombie until PID 1 reaps it)


def test_a_failing_lab_command_says_what_it_wrote_to_stderr():
    with pytest.raises(subprocess.CalledProcessError) as failed:
        sh("ip", "netns", "add", "a/b")
    assert 'Invalid netns name "a/b"' in str(failed.value)


def test_a_namespace_that_exists_is_refused_and_left_alone():
    name = f"eltest{secrets.token_hex(3)}"
    add_netns(name)
    try:
        with pytest.raises(FileExistsError, match=name):
            add_netns(name)
        assert name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        with netns_lock():
            sh("ip", "netns", "del", name, check=False)
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
