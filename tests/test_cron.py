"""Unattended runs with the real cron daemon: install, fire (libfaketime brings 03:00 within seconds),
no overlap, stale-only reruns, retries of failed stages, webhooks.

The daemon runs in a private mount namespace whose crontab spool, /etc/cron.d, /etc/crontab and /run
are the test's own: the machine's real crontabs are neither read (no real entry fires at the fake
03:00) nor written. `lab cron install` runs in that namespace too (nsenter), so it edits the test's
spool through the ordinary `crontab` command.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import LAB, REPO, TmpLab, kill_unfinished, poll, remove_dead_faketime_files
from eaglelab.control import notify
from eaglelab.control.notify import redact_url

FAKE_NIGHT = "2030-01-07 02:59:56"  # four seconds before a `0 3 * * *` entry is due
# cron runs what is due in the minutes it wakes into, never the minute it started in: a daemon whose
# start took longer than FAKE_NIGHT's four seconds (a starved 2-core CI machine) started in 03:00 and
# slept through it, one way a night passed with nothing fired (ci40, stop 47's CI). Nothing fired by
# then means the daemon missed the minute.
FIRE_WAIT_S = 90
# The last line of a firing's log: it ran (and wrote its summary), or it found another running.
END = re.compile(r"^\S+ firing \S+ (complete|stopped): .* \(exit -?\d+\)$|this firing exits without touching it$",
                 re.M)


# -- the sandboxed cron daemon ------------------------------------------------------------------

class CronSandbox:
    def __init__(self, root: Path):
        for tool in ("unshare", "nsenter", "crontab"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is missing: run bin/setup-system (as root)")
        libs = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
        if not libs:
            raise RuntimeError("libfaketime is missing (Debian's faketime package): run bin/setup-system (as root)")
        self.libfaketime = libs[0]
        if not os.path.exists("/usr/sbin/cron"):
            raise RuntimeError("/usr/sbin/cron is missing: run bin/setup-system (as root)")
        spool, crond, crontab = root / "spool", root / "cron.d", root / "crontab"
        spool.mkdir(parents=True)
        crond.mkdir()
        crontab.write_text("")
        shutil.chown(spool, "root", "crontab")
        spool.chmod(0o1730)
        script = ('mount --bind "$1" /var/spool/cron/crontabs && mount --bind "$2" /etc/cron.d && '
                  'mount --bind "$3" /etc/crontab && mount -t tmpfs tmpfs /run && echo ready && exec sleep 3600')
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
                                        "sh", str(spool), str(crond), str(crontab)],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.holder.stdout.readline()
        if line.strip() != "ready":
            self.holder.kill()
            raise RuntimeError(f"could not set up the cron namespace: {line}{self.holder.stdout.read()}")
        self.daemon: subprocess.Popen | None = None

    def run(self, argv: list[str], env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(["nsenter", "-t", str(self.holder.pid), "-m", "--", *argv], capture_output=True,
                           text=True, env=env, cwd="/", timeout=60)
        if check and p.returncode != 0:
            raise AssertionError(f"{argv} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def crontab(self) -> str:
        p = self.run(["crontab", "-l"], check=False)
        return p.stdout if p.returncode == 0 else ""

    def start_daemon(self, fake: str = FAKE_NIGHT) -> None:
        assert self.daemon is None
        # libfaketime preloaded directly, its clock starting at `fake` when cron starts (its files in
        # /dev/shm are removed in stop_daemon). The `faketime` wrapper would add a process, and files,
        # of its own.
        env = {**os.environ, "LD_PRELOAD": str(self.libfaketime), "FAKETIME": f"@{fake}"}
        self.daemon = subprocess.Popen(["nsenter", "-t", str(self.holder.pid), "-m", "--", "/usr/sbin/cron", "-f"],
                                       env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)

    def daemon_state(self) -> str:
        if self.daemon is None:
            return "not started"
        rc = self.daemon.poll()
        return "running" if rc is None else f"exited with {rc}"

    def stop_daemon(self) -> None:
        if self.daemon is not None:
            try:
                os.killpg(self.daemon.pid, signal.SIGTERM)  # cron (nsenter exec'd it)
            except ProcessLookupError:
                pass
            self.daemon.wait(timeout=10)
            self.daemon = None
            remove_dead_faketime_files()

    def close(self) -> None:
        self.stop_daemon()
        self.holder.kill()
        self.holder.wait(timeout=10)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    sb = CronSandbox(tmp_path_factory.mktemp("cron-ns"))
    yield sb
    sb.close()


# -- a lab of three chained tick stages ---------------------------------------------------------

PIPELINE = """\
vars:
  d: {data}
stages:
  a:
    host: local
    command: ["${{python}}", "-m", "eaglelab.stages.tick", "--steps", "2", "--delay", "0.05", "--output", "${{d}}/a.json"]
    inputs: ["${{d}}/src.txt"]
    outputs: ["${{d}}/a.json"]
  b:
    # b reads a.json without declaring it: only the upstream rule makes it rerun after a.
    # It fails while data/broken exists (a flaky stage whose config does not change).
    host: local
    depends_on: [a]
    command: ["${{python}}", "-c", "import os, sys, runpy; broken, out = sys.argv[1:3]; os.path.exists(broken) and sys.exit('b: broken as asked'); sys.argv = ['tick', '--steps', '2', '--delay', '0.05', '--output', out]; runpy.run_module('eaglelab.stages.tick', run_name='__main__')",
              "${{d}}/broken", "${{d}}/b.json"]
    outputs: ["${{d}}/b.json"]
  c:
    host: local
    depends_on: [b]
    command: ["${{python}}", "-m", "eaglelab.stages.tick", "--steps", "2", "--delay", "0.05", "--output", "${{d}}/c.json"]
    inputs: ["${{d}}/b.json", "${{d}}/side.txt"]
    outputs: ["${{d}}/c.json"]
"""


class NightLab(TmpLab):
    def __init__(self, root: Path, sandbox: CronSandbox):
        super().__init__(root)
        self.sb = sandbox
        self.data = root / "data"
        self.data.mkdir()
        (self.data / "src.txt").write_text("source v1\n")
        (self.data / "side.txt").write_text("side v1\n")
        self.write_pipeline(PIPELINE.format(data=self.data))
        self.cron_dir = self.logs / "cron"
        self.seen_logs: set[str] = set()

    def webhooks(self, hooks: list[tuple[str, str]]) -> None:
        lines = "\n".join(f"    - {{url: '{u}', format: {f}}}" for u, f in hooks)
        self.write_lab(f"notify:\n  status_url: http://127.0.0.1:8765/\n  webhooks:\n{lines}\n")

    def ns_lab(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`lab ARGS` inside the cron namespace (the crontab it edits is the sandbox's)."""
        return self.sb.run([str(LAB), *args], env=self.env(), check=check)

    def new_logs(self) -> list[Path]:
        logs = sorted(p for p in self.cron_dir.glob("2*.log") if p.name not in self.seen_logs) \
            if self.cron_dir.exists() else []
        return logs

    def night(self, firings: int = 1) -> list[str]:
        """Let the daemon reach 03:00 once; the texts of the firings' logs once each has ended.

        A daemon that missed 03:00 (nothing fired within FIRE_WAIT_S) gets one more start; a firing
        that started is never retried: it must end, or the test fails with what it printed."""
        def ended():
            logs = self.new_logs()
            texts = [p.read_text() for p in logs]
            if len(logs) >= firings and all(END.search(t) for t in texts):
                return logs, texts
            return None

        notes = []
        for start in (1, 2):
            out_size = self.cron_out_size()
            self.sb.start_daemon()
            try:
                fired = poll(lambda size=out_size: self.new_logs() or self.cron_out_size() > size, FIRE_WAIT_S)
                if not fired and start == 1:
                    notes.append(f"start 1: nothing fired within {FIRE_WAIT_S} s "
                                 f"(daemon {self.sb.daemon_state()}); the daemon is started again")
                    continue
                done = poll(ended, 240)  # a guard: a firing takes seconds
                if not done:
                    raise AssertionError("the firing did not end within 240 s\n" + "\n".join(notes)
                                         + "\n" + self.diagnosis())
                logs, texts = done
                break
            finally:
                self.sb.stop_daemon()
        self.seen_logs.update(p.name for p in logs)
        return texts

    def cron_out_size(self) -> int:
        try:
            return (self.cron_dir / "cron.out").stat().st_size
        except FileNotFoundError:
            return 0

    def diagnosis(self) -> str:
        """What a failed night leaves to read: cron.out, each new firing's log, the crontab."""
        parts = [f"daemon: {self.sb.daemon_state()}", "crontab:\n" + self.sb.crontab()]
        out = self.cron_dir / "cron.out"
        if out.exists():
            parts.append("cron.out (last 2000 characters):\n" + out.read_text(errors="replace")[-2000:])
        for log in self.new_logs():
            parts.append(f"{log.name} (last 2000 characters):\n" + log.read_text(errors="replace")[-2000:])
        return "\n".join(parts)

    def summary(self, text: str) -> dict:
        firing_id = text.split("eaglelab cron firing ", 1)[1].split(":", 1)[0]
        return json.loads((self.cron_dir / f"{firing_id}.json").read_text())

    def outcomes(self, summary: dict) -> dict[str, str]:
        return {s["stage"]: s["outcome"] for s in summary["stages"]}

    def plan(self) -> dict[str, str]:
        steps = json.loads(self.lab("plan", "--json").stdout)["steps"]
        return {s["stage"]: s["action"] for s in steps}


def _kill_drainer(lab: TmpLab) -> None:
    pid_file = lab.logs / "locks" / "notify-drain.pid"
    try:
        pid = int(pid_file.read_text())
        if b"eaglelab.control.notify" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


@pytest.fixture
def night(tmp_path: Path, sandbox: CronSandbox):
    # A conf path with a space and a quote: the crontab line must quote what it carries.
    lab = NightLab(tmp_path / "night's lab", sandbox)
    yield lab
    sandbox.stop_daemon()
    lab.ns_lab("cron", "remove", "--all", check=False)
    _kill_drainer(lab)
    kill_unfinished(lab.run_dirs())


# -- webhook receivers on 127.0.0.1 ---------------------------------------------------------------

class Receiver:
    """A webhook endpoint that records what it is sent."""

    def __init__(self):
        self.got: list[dict] = []
        recv = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recv.got.append({"path": self.path, "headers": dict(self.headers), "body": body})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def json(self, path: str) -> list[dict]:
        return [json.loads(g["body"]) for g in self.got if g["path"] == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class BlackHole:
    """Accepts connections and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.conns: list[socket.socket] = []
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/hook"


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


# -- the tests ------------------------------------------------------------------------------------

def test_install_list_remove_and_bad_schedule(night: NightLab):
    bad = night.ns_lab("cron", "install", "--schedule", "61 3 * * *", check=False)
    assert bad.returncode == 2 and "not a cron schedule" in bad.stderr and "'0 3 * * *'" in bad.stderr
    unknown = night.ns_lab("cron", "install", "--target", "trian", check=False)
    assert unknown.returncode == 2 and "no stage 'trian'" in unknown.stderr
    assert night.sb.crontab() == ""

    night.ns_lab("cron", "install")
    night.ns_lab("cron", "install", "--schedule", "30 4 * * 1")  # replaces, never duplicates
    tab = [ln for ln in night.sb.crontab().splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(tab) == 1
    line = tab[0]
    assert line.startswith("30 4 * * 1 ") and line.endswith(f" # eaglelab:pipeline:{night.conf}")
    # Everything cron's bare environment lacks is spelled out, absolute, quoted for sh.
    argv = shlex.split(line[len("30 4 * * 1 "):line.rindex(" # eaglelab:")])
    assert argv[argv.index("cd") + 1] == str(REPO)
    assert f"EAGLELAB_CONF={night.conf}" in argv and f"PYTHONPATH={REPO}/py:{REPO}" in argv
    python = next(a for a in argv if a.endswith("/bin/python"))
    assert os.path.isabs(python) and argv[argv.index(python) + 1:argv.index(">>")] == [
        "-m", "eaglelab.control.cli", "cron", "fire", "--target", "pipeline"]
    assert argv[argv.index(">>") + 1] == f"{night.cron_dir}/cron.out" and argv[-1] == "2>&1"

    listed = json.loads(night.ns_lab("cron", "list", "--json").stdout)
    (entry,) = listed["entries"]
    assert entry["schedule"] == "30 4 * * 1" and entry["target"] == "pipeline" and entry["this_conf"]
    assert [t[10:16] for t in entry["next"]] == ["T04:30"] * 3
    assert "next:" in night.ns_lab("cron", "list").stdout

    # A profile chosen at install time travels in the line; a second target is a second entry.
    night.ns_lab("--profile", "test", "cron", "install", "--target", "c")
    lines = [ln for ln in night.sb.crontab().splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lines) == 2 and "EAGLELAB_PROFILE=test" in lines[1] and "--target c" in lines[1]
    assert "EAGLELAB_PROFILE" not in lines[0]

    out = night.ns_lab("cron", "remove").stdout
    assert "removed 30 4 * * 1 pipeline" in out and "removed 0 3 * * * c" in out
    assert night.sb.run(["crontab", "-l"], check=False).returncode != 0  # no crontab left, not an empty one


def test_entry_fires_from_bare_env_and_reruns_only_what_is_stale(night: NightLab):
    night.ns_lab("cron", "install")
    assert night.plan() == {"a": "run", "b": "run", "c": "run"}

    (text,) = night.night()
    first = night.summary(text)
    assert first["ok"], text
    assert night.outcomes(first) == {"a": "completed", "b": "completed", "c": "completed"}
    # cron's bare environment (no LD_PRELOAD of faketime, no VIRTUAL_ENV, no test variables) ...
    env_names = set(text.split("environment: ", 1)[1].split("\n", 1)[0].split())
    assert {"HOME", "LOGNAME", "SHELL", "PATH", "EAGLELAB_CONF", "PYTHONPATH"} <= env_names
    assert not env_names & {"LD_PRELOAD", "FAKETIME", "VIRTUAL_ENV", "PYTEST_CURRENT_TEST"}
    # ... and the real clock: the firing ran now, not in the daemon's fake 2030.
    assert first["started_at"].startswith(time.strftime("%Y-", time.gmtime()))
    assert (night.cron_dir / "latest.log").resolve().name == f"{first['firing_id']}.log"
    assert "cron.out" in os.listdir(night.cron_dir)

    # Nothing changed: the next night skips every stage.
    assert night.plan() == {"a": "skip", "b": "skip", "c": "skip"}
    (text,) = night.night()
    assert night.outcomes(night.summary(text)) == {"a": "skipped", "b": "skipped", "c": "skipped"}
    assert len(night.run_dirs()) == 3

    # An input of c only: exactly c reruns.
    (night.data / "side.txt").write_text("side v2\n")
    assert night.plan() == {"a": "skip", "b": "skip", "c": "run"}
    (text,) = night.night()
    assert night.outcomes(night.summary(text)) == {"a": "skipped", "b": "skipped", "c": "completed"}

    # The source of a: a and everything downstream, b included although b's own fingerprint
    # (no declared inputs) has not changed.
    (night.data / "src.txt").write_text("source v2\n")
    plan = json.loads(night.lab("plan", "--json").stdout)["steps"]
    assert [(s["stage"], s["action"]) for s in plan] == [("a", "run"), ("b", "run"), ("c", "run")]
    assert "upstream a will rerun" in plan[1]["reason"]
    (text,) = night.night()
    summary = night.summary(text)
    assert night.outcomes(summary) == {"a": "completed", "b": "completed", "c": "completed"}
    assert "starting b on local (upstream a ran again" in text
    assert night.plan() == {"a": "skip", "b": "skip", "c": "skip"}
    assert len(night.run_dirs()) == 3 + 1 + 3


def test_two_firings_at_once_exactly_one_runs(night: NightLab):
    # Two entries due at the same minute: the pipeline, and stage c with its deps (same stages).
    night.ns_lab("cron", "install", "--target", "pipeline")
    night.ns_lab("cron", "install", "--target", "c")
    assert night.sb.crontab().count("cron fire --target") == 2

    texts = night.night(firings=2)
    busy = [t for t in texts if "this firing exits without touching it" in t]
    ran = [t for t in texts if t not in busy]
    assert len(busy) == 1 and len(ran) == 1, texts
    holder = night.summary(ran[0])
    assert f"another firing is running ({holder['firing_id']}, pid {holder['pid']}" in busy[0]
    assert "plan:" not in busy[0] and "starting" not in busy[0]
    assert holder["ok"] and len(night.run_dirs()) == 3  # each stage ran once
    assert len(list(night.cron_dir.glob("2*.json"))) == 1


def slow_a(night: NightLab) -> None:
    night.write_pipeline(PIPELINE.format(data=night.data).replace(
        '"--steps", "2", "--delay", "0.05", "--output", "${d}/a.json"',
        '"--steps", "40", "--delay", "0.5", "--output", "${d}/a.json"'))  # 20 s: the next firing, slow to start on a loaded machine, still finds it running


def start_firing(night: NightLab) -> subprocess.Popen:
    first = subprocess.Popen([str(LAB), "cron", "fire"], env=night.env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    holder_file = night.logs / "locks" / "cron-firing.json"
    night.wait_for(lambda: holder_file.exists() and night.run_dirs(), timeout=120)
    return first


def test_terminated_firing_records_how_far_it_got(night: NightLab):
    slow_a(night)
    first = start_firing(night)
    first.send_signal(signal.SIGTERM)
    rc = first.wait(timeout=60)
    text = (night.cron_dir / "latest.log").read_text()
    assert rc == 143, text
    summary = night.summary(text)
    assert not summary["ok"] and summary["exit_code"] == 143 and "interrupted" in summary["result"], text
    assert not (night.logs / "locks" / "cron-firing.json").exists()


def test_killed_firing_leaves_no_lock_and_the_next_attaches(night: NightLab):
    slow_a(night)
    first = start_firing(night)
    first.send_signal(signal.SIGKILL)  # killed mid-firing: its flock goes with it
    first.wait(timeout=10)
    second = night.lab("cron", "fire", timeout=120)
    text = (night.cron_dir / "latest.log").read_text()
    assert "another firing is running" not in text
    assert "a is already running as a-" in text and "attaching" in text
    summary = night.summary(text)
    assert summary["ok"] and night.outcomes(summary)["a"] == "attached, completed", text
    assert second.returncode == 0 and len(night.run_dirs()) == 3


def test_failed_stage_retried_next_night_with_webhooks(night: NightLab, receiver: Receiver):
    hole = BlackHole()
    dead = closed_port_url()
    try:
        night.webhooks([(receiver.url + "/generic", "generic"), (receiver.url + "/slack", "slack"),
                        (receiver.url + "/ntfy", "ntfy"), (hole.url, "generic"), (dead, "slack")])
        night.ns_lab("cron", "install")
        (night.data / "broken").write_text("b fails while this exists\n")

        (text,) = night.night()
        first = night.summary(text)
        assert not first["ok"]
        assert night.outcomes(first) == {"a": "completed", "b": "failed", "c": "not reached"}
        assert first["result"] == "stopped: b failed"

        def events(path="/generic"):
            return [(e["event"], e.get("stage") or e.get("target")) for e in receiver.json(path)]

        night.wait_for(lambda: len(events()) >= 3)
        assert sorted(events()) == sorted([("completed", "a"), ("failed", "b"), ("pipeline_finished", "pipeline")])
        failed = next(e for e in receiver.json("/generic") if e["event"] == "failed")
        assert failed["host"] == "local" and failed["reason"] == "other: ended by exit code 1; last line: b: broken as asked" and failed["exit_code"] == 1
        assert failed["status_url"] == "http://127.0.0.1:8765/" and failed["duration_s"] is not None
        assert failed["run_id"].startswith("b-")
        finished = next(e for e in receiver.json("/generic") if e["event"] == "pipeline_finished")
        assert finished["ok"] is False and finished["failed_stage"] == "b" and finished["log"].endswith(".log")
        # Nothing waited for the webhook that never answers: the night is over, its message is not.
        # (The webhooks are posted to in parallel: the black hole's connection may come just after
        # the generic receiver's third event, so it is waited for, not assumed.)
        night.wait_for(lambda: hole.conns, timeout=60)
        assert (night.cron_dir / f"{first['firing_id']}.json").exists()

        # The next night retries b (its last run failed) and goes on to c.
        (night.data / "broken").unlink()
        plan = json.loads(night.lab("plan", "--json").stdout)["steps"]
        assert [s["action"] for s in plan] == ["skip", "run", "run"]
        assert plan[1]["reason"].startswith("last run b-") and "failed (exit code 1)" in plan[1]["reason"]
        assert plan[2]["reason"] == "never ran"
        (text,) = night.night()
        second = night.summary(text)
        assert second["ok"] and night.outcomes(second) == {"a": "skipped", "b": "completed", "c": "completed"}

        # Each webhook has its own queue, drained in parallel: wait until the outbox says every delivery
        # to the three receivers was sent (each recorded before it was answered); a duplicate would be
        # a seventh delivery, which the counts below rule out once nothing is left to send.
        live = {redact_url(receiver.url + path) for path in ("/generic", "/slack", "/ntfy")}

        def all_sent():
            rows = [d for d in notify.deliveries(night.logs / "registry.sqlite", limit=200) if d["url"] in live]
            return len(rows) >= 18 and all(d["state"] == "sent" for d in rows)
        night.wait_for(all_sent, timeout=120)
        assert sorted(events()) == sorted([("completed", "a"), ("failed", "b"), ("pipeline_finished", "pipeline"),
                                           ("completed", "b"), ("completed", "c"), ("pipeline_finished", "pipeline")])
        # The same events in the Slack and ntfy shapes.
        slack = receiver.json("/slack")
        assert len(slack) == 6 and all(set(m) == {"text", "blocks"} for m in slack)
        assert any("b failed on local" in m["text"] and "exit code 1" in m["text"] for m in slack)
        assert any("<http://127.0.0.1:8765/|status page>" in json.dumps(m["blocks"]) for m in slack)
        ntfy = [g for g in receiver.got if g["path"] == "/ntfy"]
        assert len(ntfy) == 6 and all(g["headers"]["Content-Type"].startswith("text/plain") for g in ntfy)
        assert any(g["body"].startswith(b"b failed on local") and g["headers"]["Priority"] == "4" for g in ntfy)
        assert all(g["headers"]["Click"] == "http://127.0.0.1:8765/" for g in ntfy)

        # The dead webhook is being retried with backoff, in the background.
        def dead_retried():
            rows = [d for d in json.loads(night.lab("notify", "log", "-n", "100", "--json").stdout)["deliveries"]
                    if d["url"] == redact_url(dead)]  # shown redacted: a webhook URL is a secret
            return rows if any(d["attempts"] >= 2 for d in rows) else None
        rows = night.wait_for(dead_retried, timeout=30)
        assert all(d["state"] in ("pending", "failed") for d in rows)
        assert "refused" in next(d for d in rows if d["attempts"] >= 2)["last_error"].lower()
    finally:
        _kill_drainer(night)
        hole.close()


def test_cron_logs_are_this_users_only(tmplab):
    """O-9: the firings' logs hold what the stages printed; like the host's run directories they are
    0600 in a 0700 folder: the crontab line itself runs under umask 077, and a folder or cron.out
    left open (0755/0644) by an earlier version is tightened by the next firing. The crontab line
    is run as cron runs it (sh, cron's bare environment, cron's umask 022)."""
    import stat
    import sys

    from eaglelab.control.pipeline import cron as cronlib
    tmplab.write_pipeline("""\
        stages:
          hello:
            host: local
            command: ["${python}", "-c", "print('hello from the stage')"]
        """)
    cron_dir = tmplab.logs / "cron"
    cron_dir.mkdir(parents=True)
    (cron_dir / "cron.out").write_text("an earlier firing\n")
    os.chmod(cron_dir / "cron.out", 0o644)
    os.chmod(cron_dir, 0o755)
    line = cronlib.fire_command(target="pipeline", python=sys.executable, repo=REPO, conf_dir=tmplab.conf,
                                profile="test", logs_dir=tmplab.logs)
    env = {"HOME": str(tmplab.root), "LOGNAME": "root", "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh"}
    subprocess.run(["sh", "-c", f"umask 022; {line}"], env=env, check=True, timeout=120)
    mode = lambda p: stat.S_IMODE(os.lstat(p).st_mode)
    logs = [p for p in cron_dir.iterdir() if not p.is_symlink()]
    assert any(p.suffix == ".log" for p in logs) and any(p.suffix == ".json" for p in logs), logs
    assert mode(cron_dir) == 0o700 and {p.name: mode(p) for p in logs} == {p.name: 0o600 for p in logs}
    assert b"complete: ran 1" in b"".join(p.read_bytes() for p in logs if p.suffix == ".log")

    fresh = tmplab.root / "logs2"  # and a first firing makes them so (cron's own `>>` included)
    line = cronlib.fire_command(target="pipeline", python=sys.executable, repo=REPO, conf_dir=tmplab.conf,
                                profile="test", logs_dir=fresh)
    subprocess.run(["sh", "-c", f"umask 022; {line}"], env=env, check=True, timeout=120)
    assert mode(fresh / "cron") == 0o700 and mode(fresh / "cron" / "cron.out") == 0o600
