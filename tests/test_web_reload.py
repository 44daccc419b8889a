"""`lab web` follows its configuration files: the real server (started as docs/web.md says), a real
stage rerun through the page's action API after the profile changed, a profile broken and fixed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request

from conftest import LAB, wait_for
from test_web_browser import free_port

TOKEN = "reload-test-token"
PIPELINE = """\
stages:
  write:
    host: local
    command: ["${python}", "-c", "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.parent.mkdir(parents=True, exist_ok=True); p.write_text('written')", "${out}"]
    outputs: ["${out}"]
"""


def profile(out) -> str:
    return f"vars:\n  out: {str(out)!r}\n"


def start(tmplab, port: int) -> subprocess.Popen:
    env = {**tmplab.env(), "EAGLELAB_TOKEN": TOKEN}
    proc = subprocess.Popen([str(LAB), "web", "--port", str(port), "--refresh", "0.5"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: get(port, "/api/status")[0] == 200, timeout=30, interval=0.2)
    except AssertionError:
        proc.kill()
        raise AssertionError(f"lab web did not answer: {proc.stdout.read().decode()}") from None
    return proc


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def rerun(port: int) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/stages/write/rerun", method="POST", data=b"",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def ended(port: int) -> bool:
    """Every run of the page's last refresh has ended (a rerun of a running stage attaches to it)."""
    runs = json.loads(get(port, "/api/status")[1] or "{}").get("runs")
    return bool(runs) and all(r["state"] == "completed" for r in runs)


def recorded_command(tmplab, run_id: str) -> list[str]:
    return json.loads((tmplab.work / "runs" / run_id / "meta.json").read_text())["command"]


def test_a_rerun_from_the_page_uses_the_profile_as_it_is_now(tmplab):
    first, second = tmplab.root / "data" / "first.txt", tmplab.root / "data" / "second.txt"
    tmplab.write_pipeline(PIPELINE)
    tmplab.write_profile("test", profile(first))
    port = free_port()
    web = start(tmplab, port)
    try:
        code, body = rerun(port)
        assert code in (200, 202), body
        wait_for(first.exists, timeout=30)
        wait_for(lambda: ended(port), timeout=30)
        assert "Configuration reloaded" not in get(port, "/")[1]

        # the output path changes; the next rerun comes at once, before any refresh saw the edit
        tmplab.write_profile("test", profile(second))
        code, body = rerun(port)
        assert code in (200, 202), body
        wait_for(second.exists, timeout=30)
        wait_for(lambda: ended(port), timeout=30)
        # two runs of one second: their ids do not sort by start, so ask each which file it wrote
        outputs = sorted(recorded_command(tmplab, p.name)[-1] for p in (tmplab.work / "runs").iterdir())
        assert outputs == sorted([str(first), str(second)]), outputs
        # and the page says so: when, and which file
        page = wait_for(lambda: (t := get(port, "/")[1]) and "config-reloaded" in t and t, timeout=30)
        assert "profiles/test.yaml changed" in page
        config = json.loads(get(port, "/api/status")[1])["config"]
        assert config["reloaded"]["files"] == [str(tmplab.conf / "profiles" / "test.yaml")]

        # a profile that does not load: the page stays up with the error, actions are refused
        tmplab.write_profile("test", profile(second) + "stages:\n  write:\n    host: nowhere\n")
        code, body = rerun(port)
        assert code == 409 and "does not load" in body["error"] and "nowhere" in body["error"], body
        page = wait_for(lambda: (r := get(port, "/")) and r[0] == 200 and "config-error" in r[1] and r[1],
                        timeout=30)
        assert "nowhere" in page and "profiles/test.yaml" in page
        status = json.loads(get(port, "/api/status")[1])
        assert "nowhere" in status["config"]["error"]["message"]
        assert [s["name"] for s in status["stages"]] == ["write"]  # the last good configuration, shown
        assert len(list((tmplab.work / "runs").iterdir())) == 2  # nothing ran

        # fixed: the banner goes, actions work again
        third = tmplab.root / "data" / "third.txt"
        tmplab.write_profile("test", profile(third))
        code, body = rerun(port)
        assert code in (200, 202), body
        wait_for(third.exists, timeout=30)
        wait_for(lambda: "config-error" not in get(port, "/")[1], timeout=30)
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGTERM)
            web.wait(timeout=30)


def test_the_watch_follows_lab_yamls_profile_and_a_put_back_file_clears_the_error(tmplab):
    from eaglelab.control.lab import Lab
    from status_web.config_watch import ConfigStale, ConfigWatch
    tmplab.write_pipeline(PIPELINE)
    tmplab.write_profile("test", profile(tmplab.root / "a"))
    tmplab.write_profile("other", profile(tmplab.root / "b"))
    lab = Lab.load(str(tmplab.conf))
    watch = ConfigWatch(lab, profile=None)  # `lab web` without --profile
    assert watch.check() is lab and watch.reloaded is None  # nothing changed: the same lab
    lab_yaml = tmplab.conf / "lab.yaml"
    lab_yaml.write_text(lab_yaml.read_text().replace("profile: test", "profile: other"))
    new = watch.for_action()
    assert new is not lab and new.cfg.profile == "other"
    assert watch.reloaded["files"] == [str(lab_yaml), str(tmplab.conf / "profiles" / "other.yaml")]
    tmplab.write_profile("test", profile(tmplab.root / "c"))  # no longer in use: no reload
    assert watch.check() is new
    good = (tmplab.conf / "profiles" / "other.yaml").read_bytes()
    (tmplab.conf / "profiles" / "other.yaml").write_text("stages: [oops\n")
    assert watch.check() is new and "not valid YAML" in watch.error["message"]
    try:
        watch.for_action()
        raise AssertionError("an action ran on a configuration that does not load")
    except ConfigStale as e:
        assert "other.yaml" in str(e)
    (tmplab.conf / "profiles" / "other.yaml").write_bytes(good)  # put back as it was
    assert watch.for_action() is new and watch.error is None


def test_a_reload_error_puts_no_config_value_on_the_page(tmplab):
    """O-4: a config that does not load is named on /api/status and the page by file, key and line,
    never by the values there: a webhook URL, a stage's env: secret, YAML's quote of a line."""
    tmplab.write_pipeline(PIPELINE)
    tmplab.write_profile("test", profile(tmplab.root / "out.txt"))
    port = free_port()
    web = start(tmplab, port)
    good = (tmplab.conf / "lab.yaml").read_text()
    prof = profile(tmplab.root / "out.txt")
    broken = [  # (file, text, what the error names instead of the value)
        ("lab.yaml", good + "notify:\n  webhooks:\n    - {url: 'https://hooks.example/T0/B0/SECRET-HOOK', "
                            "url_env: LAB_HOOK}\n", "notify.webhooks.0"),
        ("profiles/test.yaml", prof + "stages:\n  write:\n    env: {HF_TOKEN: [hf_SECRET-ENV]}\n",
         "stages.write.env.HF_TOKEN"),
        ("profiles/test.yaml", prof + "stages:\n  write:\n    env:\n      HF_TOKEN: \"hf_SECRET-YAML\n      X: 1\n",
         "not valid YAML at line "),
    ]
    try:
        for name, text, names in broken:
            (tmplab.conf / "lab.yaml").write_text(good)
            (tmplab.conf / name).write_text(text)
            error = wait_for(lambda names=names: (e := json.loads(get(port, "/api/status")[1])["config"]["error"])
                             and names in e["message"] and e, timeout=20)
            page = get(port, "/")[1]
            assert "SECRET" not in json.dumps(error) and "SECRET" not in page, (name, error)
            assert name in error["message"] and "config-error" in page, error
            code, body = rerun(port)
            assert code == 409 and "SECRET" not in json.dumps(body), body
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGTERM)
            web.wait(timeout=30)


def test_the_read_cookie_cannot_act(tmplab):
    """O-1: with --read-token the browser's cookie held the token itself, and browsers send a host's
    cookies to every port: another user's server on a neighbouring port got it and replayed a
    rerun. The cookie now holds a read-only credential; actions take the token in a header only."""
    tmplab.write_pipeline(PIPELINE)
    tmplab.write_profile("test", profile(tmplab.root / "out.txt"))
    port = free_port()
    env = {**tmplab.env(), "EAGLELAB_TOKEN": TOKEN}
    web = subprocess.Popen([str(LAB), "web", "--port", str(port), "--read-token", "--refresh", "0.5"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **kw):
            return None
    opener = urllib.request.build_opener(NoRedirect)

    def ask(path, method="GET", headers=None):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers or {},
                                     data=b"" if method == "POST" else None)
        try:
            with opener.open(req, timeout=15) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()
        except OSError:
            return 0, {}, ""
    try:
        wait_for(lambda: ask("/healthz")[0] == 200, timeout=30)
        code, headers, _ = ask(f"/?token={TOKEN}")  # a browser opens the page once with the token
        assert code == 302 and "HttpOnly" in headers["Set-Cookie"], headers
        cookie = headers["Set-Cookie"].split(";")[0]
        assert TOKEN not in headers["Set-Cookie"], headers["Set-Cookie"]
        wait_for(lambda: ask("/api/status", headers={"Cookie": cookie})[0] == 200, timeout=30)  # it reads
        assert ask("/api/status")[0] == 401  # and without it, nothing
        value = cookie.split("=", 1)[1]
        for replay in ({"Cookie": cookie}, {"Authorization": f"Bearer {value}"},
                       {"Cookie": cookie, "Authorization": f"Bearer {value}"}):  # the neighbour's replays
            code, _, body = ask("/api/stages/write/rerun", "POST", replay)
            assert code == 401, (replay, code, body)
        assert not (tmplab.root / "out.txt").exists() and not tmplab.run_dirs()
        code, _, body = ask("/api/stages/nosuch/rerun", "POST", {"Authorization": f"Bearer {TOKEN}"})
        assert code == 404 and "no stage 'nosuch'" in body, body  # the token, in the header, gets past the gate
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGTERM)
            web.wait(timeout=30)


def test_a_reload_that_changes_the_web_settings_is_refused_visibly(tmplab):
    """O-11: lab.yaml's web.allowed_hosts (or token_env, host, port) edited under a running `lab web`
    reloaded without a word while the server kept answering the old Host names with the old token.
    Such a reload is refused: /api/status and the page name the key and say to restart, actions
    answer 409 with the same words, the new name is not answered yet; put back, all is as before."""
    tmplab.write_pipeline(PIPELINE)
    tmplab.write_profile("test", profile(tmplab.root / "out.txt"))
    port = free_port()
    web = start(tmplab, port)
    lab_yaml = tmplab.conf / "lab.yaml"
    good = lab_yaml.read_text()
    try:
        lab_yaml.write_text(good + "web:\n  allowed_hosts: [gpu-box.lab]\n")
        error = wait_for(lambda: json.loads(get(port, "/api/status")[1])["config"]["error"], timeout=20)
        assert "web.allowed_hosts changed" in error["message"] and "restart" in error["message"], error
        assert "config-error" in get(port, "/")[1]
        code, body = rerun(port)
        assert code == 409 and "web.allowed_hosts" in json.dumps(body), body
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/status", headers={"Host": "gpu-box.lab"})
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("the new Host name was answered before a restart")
        except urllib.error.HTTPError as e:
            assert e.code in (400, 403, 421), e.code
        lab_yaml.write_text(good)  # put back: the error goes, as with any file put back
        wait_for(lambda: json.loads(get(port, "/api/status")[1])["config"]["error"] is None, timeout=20)
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGTERM)
            web.wait(timeout=30)
