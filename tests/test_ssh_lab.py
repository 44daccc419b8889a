"""Stages on real hosts over ssh (namespaces + sshd, tests/testlab.py): parallel launch, a killed
controller, a cut link, a job killed on its host, stop, orphans. The real `lab` CLI throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from conftest import wait_for as _wait_for


def tick(host: str, steps: int, delay: float) -> dict:
    return {"host": host, "command": ["${python}", "-m", "eaglelab.stages.tick", "--steps", str(steps),
                                      "--delay", str(delay)]}


def wait_for(pred, timeout: float = 60, interval: float = 0.3):
    return _wait_for(pred, timeout, interval)


def runs_by_stage(status: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in status["runs"]:
        out.setdefault(r["stage"], []).append(r)
    return out


def host_run_ids(sshlab, host: str) -> list[str]:
    d = sshlab.net.home(host) / sshlab.work[2:] / "runs"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_parallel_launch_on_every_host_and_status_shows_all(sshlab):
    hosts = list(sshlab.net.hosts)
    sshlab.write({f"t_{h}": tick(h, 8, 0.25) for h in hosts})
    procs = [sshlab.popen("run", f"t_{h}", "--detach", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for h in hosts]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, (out, err)
    st = sshlab.status()
    assert {h["name"]: h["reachable"] for h in st["hosts"]} == {h: True for h in hosts}
    by_stage = runs_by_stage(st)
    for h in hosts:
        (run,) = by_stage[f"t_{h}"]
        assert run["host"] == h and run["state"] in ("running", "completed")
        # it ran on that host: its run directory is under that host's own home
        assert run["run_dir"].startswith(str(sshlab.net.home(h)) + "/")
        assert host_run_ids(sshlab, h) == [run["id"]]
    final = wait_for(lambda: (s := sshlab.status()) and all(r["state"] == "completed" for r in s["runs"]) and s)
    assert sorted((r["host"], r["exit_code"]) for r in final["runs"]) == [(h, 0) for h in hosts]


def test_killed_controller_recovers_every_run_and_restarts_none(sshlab):
    hosts = list(sshlab.net.hosts)
    sshlab.write({f"t_{h}": tick(h, 60, 0.2) for h in hosts})
    procs = [sshlab.popen("run", f"t_{h}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for h in hosts]
    wait_for(lambda: all(len(host_run_ids(sshlab, h)) == 1 for h in hosts), timeout=60)
    first = {h: host_run_ids(sshlab, h)[0] for h in hosts}
    for p in procs:  # the controller dies mid-run (closed laptop, OOM, kill -9) ...
        p.send_signal(signal.SIGKILL)
        p.wait()
    for f in sshlab.logs.glob("registry.sqlite*"):  # ... and its registry with it
        f.unlink()
    st = sshlab.status()  # rebuilt from the hosts alone
    assert {r["host"]: (r["id"], r["state"]) for r in st["runs"]} == {h: (first[h], "running") for h in hosts}
    # `lab run` again (as `make` would) attaches to each run; nothing is started twice
    again = {h: sshlab.popen("run", f"t_{h}", "--quiet", stdout=subprocess.PIPE, text=True) for h in hosts}
    for h, p in again.items():
        out = p.communicate(timeout=120)[0]
        assert p.returncode == 0 and first[h] in out and ("attaching" in out or "up to date" in out), out
    st = sshlab.status()
    assert sorted((r["host"], r["id"], r["state"], r["exit_code"]) for r in st["runs"]) == \
        [(h, first[h], "completed", 0) for h in hosts]
    assert {h: host_run_ids(sshlab, h) for h in hosts} == {h: [first[h]] for h in hosts}


def test_cut_link_keeps_job_running_and_mirror_equals_host_log(sshlab):
    net = sshlab.net
    sshlab.write({"long": tick("h2", 60, 0.2)}, hosts=["h2"])
    sshlab.lab("run", "long", "--detach")
    run_id = host_run_ids(sshlab, "h2")[0]
    host_log = sshlab.run_dir("h2", run_id) / "output.log"
    wait_for(lambda: host_log.exists() and host_log.stat().st_size > 200)
    sshlab.lab("mirror", "long")  # the controller's copy has a prefix of the log
    mirror = sshlab.logs / "mirror" / "h2" / f"{run_id}.log"
    before_cut = mirror.stat().st_size
    assert before_cut > 0
    net.cut("h2")
    try:
        cut_at = time.time()
        st = sshlab.status()
        h2 = next(h for h in st["hosts"] if h["name"] == "h2")
        assert h2["reachable"] is False and h2["unreachable_since"]
        run = next(r for r in st["runs"] if r["id"] == run_id)
        assert run["state"] == "running" and run["host_unreachable"] is True  # last known state, not failed
        assert next(s for s in st["stages"] if s["name"] == "long")["state"] == "unreachable"
        assert sshlab.lab("mirror", "long", check=False).returncode != 0
        time.sleep(max(0.0, 5 - (time.time() - cut_at)))  # longer than ConnectTimeout 2 + ServerAlive 1×2
        size_during_cut = host_log.stat().st_size
        assert sshlab.status()["hosts"][0]["reachable"] is False
    finally:
        net.restore("h2")
    assert host_log.stat().st_size > size_during_cut or (sshlab.run_dir("h2", run_id) / "exit.json").exists()
    final = wait_for(lambda: (r := next(r for r in sshlab.status()["runs"] if r["id"] == run_id))["state"]
                     == "completed" and r, timeout=60)
    assert final["exit_code"] == 0 and host_run_ids(sshlab, "h2") == [run_id]
    sshlab.lab("mirror", "long")
    assert mirror.read_bytes() == host_log.read_bytes()
    assert b"tick: done" in mirror.read_bytes()


def test_job_sigkilled_on_host_ends_failed_by_signal_9(sshlab):
    sshlab.write({"victim": tick("h3", 300, 0.1)}, hosts=["h3"])
    sshlab.lab("run", "victim", "--detach")
    run_id = host_run_ids(sshlab, "h3")[0]
    meta = sshlab.run_dir("h3", run_id) / "meta.json"
    pid = wait_for(lambda: json.loads(meta.read_text()).get("pid"))
    os.kill(pid, signal.SIGKILL)  # the host's OOM killer, or a user's kill -9
    run = wait_for(lambda: (r := sshlab.status()["runs"][0])["state"] != "running" and r, timeout=20)
    assert (run["state"], run["signal"], run["exit_code"]) == ("failed", 9, None)
    assert run["ended_at"] and run["log_state"]["failure"]["reason"] == "host_oom_killed"


def test_stop_reaches_the_remote_process_group(sshlab):
    # a stage whose child ignores TERM: only the group KILL after the grace ends it
    script = ("import subprocess, time; subprocess.Popen(['sh', '-c', 'trap \"\" TERM; sleep 300']); "
              "print('up', flush=True); time.sleep(300)")
    sshlab.write({"svc": {"host": "h1", "command": ["${python}", "-c", script], "stop_grace_s": 1}}, hosts=["h1"])
    sshlab.lab("run", "svc", "--detach")
    run_id = host_run_ids(sshlab, "h1")[0]
    meta = sshlab.run_dir("h1", run_id) / "meta.json"
    pgid = wait_for(lambda: json.loads(meta.read_text()).get("pgid"))
    wait_for(lambda: b"up" in (sshlab.run_dir("h1", run_id) / "output.log").read_bytes())
    out = sshlab.lab("stop", "svc").stdout
    assert "killed" in out
    run = sshlab.status()["runs"][0]
    assert run["state"] == "killed" and run["signal"] in (15, 9)
    wait_for(lambda: not _group_alive(pgid), timeout=10)  # the sleep child is gone too


def test_stage_leaving_processes_behind_is_reported(sshlab):
    # the stage exits 0 but leaves a child of its group running (a zombie worker holding GPU memory)
    script = "import subprocess; subprocess.Popen(['sleep', '300']); print('bye')"
    sshlab.write({"leaky": {"host": "h1", "command": ["${python}", "-c", script]}}, hosts=["h1"])
    sshlab.lab("run", "leaky", "--quiet")
    run = sshlab.status()["runs"][0]
    assert run["state"] == "completed" and run["orphans"] is True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_logs_follow_streams_from_the_host_and_mirrors(sshlab):
    sshlab.write({"talk": tick("h1", 10, 0.2)}, hosts=["h1"])
    sshlab.lab("run", "talk", "--detach")
    out = sshlab.lab("logs", "-f", "talk").stdout
    (run_id,) = host_run_ids(sshlab, "h1")
    host_log = (sshlab.run_dir("h1", run_id) / "output.log").read_bytes()
    text = host_log.decode().replace("\r\n", "\n").replace("\r", "\n")  # as a text-mode pipe reads it
    assert out.startswith(text) and out.rstrip().endswith(f"{run_id} completed")
    assert (sshlab.logs / "mirror" / "h1" / f"{run_id}.log").read_bytes() == host_log


def test_a_host_that_cannot_run_the_package_does_not_break_status(sshlab):
    sshlab.write({"a": tick("h1", 1, 0.1), "b": tick("h2", 1, 0.1)}, hosts=["h1", "h2"])
    import yaml
    conf = yaml.safe_load((sshlab.conf / "lab.yaml").read_text())
    conf["hosts"]["h2"]["python"] = "/nonexistent/venv/bin/python"  # never synced
    (sshlab.conf / "lab.yaml").write_text(yaml.safe_dump(conf))
    hosts = {h["name"]: h for h in sshlab.status()["hosts"]}
    assert hosts["h1"]["reachable"] is True
    assert hosts["h2"]["reachable"] is False and "lab sync h2" in hosts["h2"]["error"]


def test_logs_shows_the_end_of_a_big_remote_log(sshlab):
    script = "import sys\nfor i in range(50000): print(f'line {i:06d} ' + 'x' * 30)\nprint('THE END')"
    sshlab.write({"chatty": {"host": "h2", "command": ["${python}", "-c", script]}}, hosts=["h2"])
    sshlab.lab("run", "chatty", "--quiet")
    out = sshlab.lab("logs", "chatty", "-n", "2").stdout.splitlines()
    assert out[-1] == "THE END" and out[-2].startswith("line 049999")


def test_readiness_is_asked_on_the_services_host(sshlab):
    """A service's ready.url is fetched on the host that runs it: something answering on the same
    port of the controller does not make a remote service ready (it used to, within a second)."""
    import http.server
    import socket
    import threading
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    silent = ["${python}", "-c", "import time; time.sleep(600)"]
    serving = ["${python}", "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    try:
        for name, command in (("quiet", silent), ("real", serving)):
            sshlab.write({f"svc_{name}": {"host": "h1", "kind": "service", "command": command, "stop_grace_s": 1,
                                          "ready": {"url": f"http://127.0.0.1:{port}/", "timeout_s": 8}},
                          "job": {"host": "h1", "command": ["true"], "needs": [f"svc_{name}"]}}, hosts=["h1"])
            p = sshlab.lab("run", "job", check=False, timeout=120)
            if name == "quiet":  # the controller's impostor answers 200; h1's port is closed
                assert p.returncode != 0 and "ready" in p.stderr, p.stdout + p.stderr
            else:  # listening on h1 itself
                assert p.returncode == 0 and "service svc_real is ready" in p.stdout, p.stdout + p.stderr
            sshlab.lab("stop", f"svc_{name}", check=False)
    finally:
        impostor.shutdown()


def test_a_first_run_prior_measures_its_input_on_the_stages_host(sshlab):
    """hostside input_sizes over ssh: `~` is h1's home, not the controller's; the ETA is that size
    x the declared throughput (docs/eta.md)."""
    (sshlab.net.home("h1") / "rows-prior.jsonl").write_text("{}\n" * 7)
    prior = {"unit": "samples", "measure": "~/rows-prior.jsonl", "per_s": 1, "expected": 3}
    sshlab.write({"job": {"host": "h1", "command": ["true"], "prior": prior}}, hosts=["h1"])
    e = next(s["eta"] for s in sshlab.status()["stages"] if s["name"] == "job")
    assert (e["source"], e["eta_s"]) == ("prior", 7.0) and "lines of ~/rows-prior.jsonl" in e["basis"], e


FINISH_ON_GO = ("import sys, time\nfrom pathlib import Path\nfrom eaglelab import manifest\n"
                "out, go = (Path(a) for a in sys.argv[1:3])\n"
                "for i in range(1, 1001):\n    if go.exists(): break\n"
                "    time.sleep(0.2); print(f'\\rwork: {i // 10}%| | {i}/1000 [00:01<00:01, 5.00it/s]', end='', flush=True)\n"
                "out.mkdir(parents=True, exist_ok=True); (out / 'data.bin').write_bytes(b'x' * 100)\n"
                "manifest.write(out, 'manifested', [out / 'data.bin'])\n")


def test_an_orphan_that_finishes_on_its_host_is_completed_by_its_manifest(sshlab):
    """Over ssh as locally: jobwrap SIGKILLed on the host, the stage finishes on its own; its
    progress is followed there meanwhile, and its outputs' manifest of this run makes it completed."""
    base = sshlab.net.home("h2") / sshlab.work[2:]  # h2's work dir, by its absolute path
    sshlab.write({"manifested": {"host": "h2", "command": ["${python}", "-c", FINISH_ON_GO, f"{base}/out/m", f"{base}/go"],
                                 "outputs": [f"{base}/out/m"]}}, hosts=["h2"])
    sshlab.lab("run", "manifested", "--detach")
    run_id = host_run_ids(sshlab, "h2")[0]
    rd = sshlab.run_dir("h2", run_id)
    meta = wait_for(lambda: (m := json.loads((rd / "meta.json").read_text())).get("pid") and m)
    os.kill(meta["jobwrap_pid"], signal.SIGKILL)

    def progress() -> int | None:  # as `lab status` shows it while the run is orphaned
        r = sshlab.status()["runs"][0]
        return ((r["log_state"] or {}).get("progress") or {}).get("n", 0) if r.get("orphaned") else None

    first = wait_for(lambda: (n := progress()) is not None and [n])[0]
    wait_for(lambda: (progress() or -1) >= first + 3)
    (base / "go").touch()
    run = wait_for(lambda: (r := sshlab.status()["runs"][0])["state"] != "running" and r, timeout=30)
    assert (run["state"], run["lost"]) == ("completed", False), run


def test_a_mirrored_log_is_this_users_only_like_the_hosts(sshlab):
    """O-9: the controller's copy of a run's log (what the stage printed: tokens, paths, maybe a
    secret it echoed) is 0600 in 0700 folders, as the host keeps the original; a mirror folder an
    earlier version left open (0755) is tightened."""
    import stat
    sshlab.write({"say": tick("h1", 2, 0.05)}, hosts=["h1"])
    (sshlab.logs / "mirror").mkdir(parents=True, exist_ok=True)
    os.chmod(sshlab.logs / "mirror", 0o755)
    sshlab.lab("run", "say", "--quiet")
    sshlab.lab("mirror", "say")
    (run_id,) = host_run_ids(sshlab, "h1")
    log = sshlab.logs / "mirror" / "h1" / f"{run_id}.log"
    assert log.read_bytes() == (sshlab.run_dir("h1", run_id) / "output.log").read_bytes()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (sshlab.logs / "mirror", log.parent, log)}
    assert modes == {"mirror": 0o700, "h1": 0o700, log.name: 0o600}
