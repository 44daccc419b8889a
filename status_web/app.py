"""The status page: one Flask app over the same core as the CLI (eaglelab.control.status.collect, Lab).

Views only read the background snapshot (snapshot.py), turn it into a view model (model.py) and
render; Jinja autoescapes every value. Reading needs no token unless `read_token` is set; actions
(POST) need `Authorization: Bearer <token>` and are disabled (403) when no token is configured.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from flask import Flask, Response, abort, jsonify, redirect, render_template, request, url_for

from eaglelab.control.lab import Lab
from eaglelab.control.status import collect
from eaglelab.model import RunState, StageState

from . import metrics as metrics_mod
from . import model, svg
from .config_watch import ConfigStale, ConfigWatch
from .outcome import OutcomeReader
from .snapshot import ProcessSnapshot, Snapshot, serve_refreshes

LOG_TAIL_BYTES = 64 * 1024
ACTION_WAIT_S = 10.0


@dataclass
class WebState:
    watch: ConfigWatch | None  # the lab, reloaded when its files change (None: read-only, e.g. a replayed status)
    snapshot: Snapshot | ProcessSnapshot
    token: str | None
    read_token: bool
    allowed_hosts: frozenset[str]  # Host header names answered (without the port)

    @property
    def lab(self):
        """The lab as last loaded (for reading: log tails); actions take watch.for_action()."""
        return self.watch.lab if self.watch is not None else None


def create_app(lab=None, *, conf: str | None = None, profile: str | None = None,
               source: Callable[[], dict] | None = None, token: str | None = None, read_token: bool = False,
               refresh_s: float = 2.0, start: bool = True, clock: Callable[[], float] = time.time,
               refresher: str = "thread", ask_hosts: bool = True, bind_host: str | None = None,
               allowed_hosts: list[str] | None = None, follow_profile: bool = False) -> Flask:
    """The app for a lab (or Lab.load(conf, profile)). `source` replaces collect(lab) (benchmarks,
    tests); `token` defaults to the env var named by lab.yaml's web.token_env; `start=False` leaves
    the background refresh to the caller (app.extensions['eaglelab'].snapshot.refresh_now()).
    refresher="process" (what `lab web` uses) refreshes in a child process: see snapshot.py.
    ask_hosts=False reads the registry only (benchmarks). Requests are answered only for a Host
    header naming `bind_host`, localhost, 127.0.0.1, ::1 or one of `allowed_hosts` (default:
    lab.yaml web.allowed_hosts): a DNS-rebinding page's requests name its own domain.
    The lab is reloaded when its configuration files change (config_watch.py); follow_profile:
    a reload takes the profile lab.yaml names then (else the lab's profile stays)."""
    source_given = source is not None
    if lab is None and source is None:
        lab = Lab.load(conf, profile)
        follow_profile = follow_profile or profile is None
    watch = ConfigWatch(lab, profile=None if follow_profile else lab.cfg.profile) if lab is not None else None
    if source is None:
        readers: dict = {}

        def source() -> dict:
            current_lab = watch.check()  # a changed file is seen before the hosts are asked
            outcome_of = readers.get(id(current_lab))
            if outcome_of is None:  # one reader per loaded lab (its stages and hosts)
                readers.clear()
                outcome_of = readers[id(current_lab)] = OutcomeReader(current_lab)
            status = collect(current_lab, refresh=ask_hosts).to_json()
            status["config"] = watch.view()
            try:
                return outcome_of(status)
            except Exception as e:  # noqa: BLE001 - the status still serves; the banner says why
                status["outcome"] = {"verdict": "NOT MEASURED", "reasons": [f"outcome unreadable: {e}"[:300]]}
                return status
    if token is None and lab is not None:
        token = os.environ.get(lab.cfg.lab.web.token_env) or None
    local_hosts = (lambda: {n for n, h in watch.lab.cfg.hosts.items() if h.reach == "local"}) if watch else set
    if refresher == "process":
        if lab is None or source_given:
            raise ValueError("refresher='process' needs a lab loaded from its conf (no `source`)")
        snap = ProcessSnapshot(_refresher_main, {"conf": str(lab.cfg.conf_dir), "profile": watch.profile,
                                                 "follow_profile": follow_profile, "token": token,
                                                 "read_token": read_token, "ask_hosts": ask_hosts}, refresh_s)
    else:
        snap = Snapshot(source, refresh_s, local_hosts=local_hosts, clock=clock)

    if allowed_hosts is None:
        allowed_hosts = list(lab.cfg.lab.web.allowed_hosts) if lab is not None else []
    names = {"localhost", "127.0.0.1", "::1", *(h.lower() for h in allowed_hosts)}
    if bind_host and bind_host not in ("0.0.0.0", "::"):
        names.add(bind_host.lower())

    app = Flask(__name__)
    app.config["JSON_SORT_KEYS"] = False
    state = WebState(watch, snap, token or None, read_token, frozenset(names))
    app.extensions["eaglelab"] = state
    _routes(app, state, clock)
    if start:
        snap.start()
    return app


def _refresher_main(conn, child_args: dict, interval_s: float) -> None:
    """The refresher process (ProcessSnapshot): the same app, refreshed in-thread, sent as bytes."""
    app = create_app(**child_args, refresh_s=interval_s, start=False, refresher="thread")
    serve_refreshes(conn, app.extensions["eaglelab"].snapshot, interval_s)


def _routes(app: Flask, st: WebState, clock: Callable[[], float]) -> None:
    snap = st.snapshot

    # -- tokens ------------------------------------------------------------------------------
    # Two credentials. Reading: the token in an Authorization header, or the read cookie, which
    # holds only read_credential(token) (browsers send a host's cookies to every port of it: a
    # neighbour's server on another port gets the cookie and must not be able to act with it).
    # Acting: the token itself, in an Authorization header only (a cookie never authorizes a POST,
    # so no other page can make the browser act either).
    read_cookie = read_credential(st.token) if st.token else None

    def bearer_ok() -> bool:
        header = request.headers.get("Authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if st.token and given:
            return hmac.compare_digest(given.encode(), st.token.encode())
        cookie = request.cookies.get(READ_COOKIE, "")
        return bool(read_cookie and cookie and hmac.compare_digest(cookie.encode(), read_cookie.encode()))

    def unauthorized(msg: str) -> Response:
        resp = jsonify({"error": msg})
        resp.status_code = 401
        resp.headers["WWW-Authenticate"] = 'Bearer realm="eaglelab"'
        return resp

    @app.before_request
    def _host_gate():
        if host_name(request.host) not in st.allowed_hosts:
            return _json_error(421, f"this server does not answer for Host {request.host!r}; add the name to "
                                    "lab.yaml web.allowed_hosts to open the page by it")
        return None

    @app.before_request
    def _reading_gate():
        if not st.read_token or request.endpoint in ("static", "healthz"):
            return None
        q = request.args.get("token")
        if q and st.token and hmac.compare_digest(q.encode(), st.token.encode()) and request.method == "GET":
            # a browser cannot send a header on navigation: trade the query for a cookie once, and
            # go back to the same path without it (never through url_for: any query key is allowed)
            rest = urlencode([(k, v) for k, v in request.args.items(multi=True) if k != "token"])
            resp = redirect(request.path + (f"?{rest}" if rest else ""))
            resp.set_cookie(READ_COOKIE, read_cookie, httponly=True, samesite="Strict", path="/")
            return resp
        if not bearer_ok():
            return unauthorized("reading needs the token: Authorization: Bearer <token> (or open ?token=...)")
        return None

    def action_lab():
        """The lab to act with, its files checked just now (never a stale or broken configuration)."""
        try:
            return st.watch.for_action()
        except ConfigStale as e:
            abort(_json_error(409, str(e)))

    def require_action_token():
        if not st.token:
            abort(_json_error(403, "actions are disabled: the server has no token configured "
                                   "(set the env var named by web.token_env, default EAGLELAB_TOKEN)"))
        header = request.headers.get("Authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        if not given or not hmac.compare_digest(given.encode(), st.token.encode()):
            abort(unauthorized("missing or wrong token: send Authorization: Bearer <token>"))
        if st.lab is None:
            abort(_json_error(403, "this server is read-only (no lab)"))

    @app.after_request
    def _headers(resp: Response) -> Response:
        resp.headers.setdefault("X-Content-Type-Options", "nosniff")
        resp.headers.setdefault("Referrer-Policy", "no-referrer")
        resp.headers.setdefault("Content-Security-Policy",
                                "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                                "frame-ancestors 'none'")
        return resp

    # -- helpers -----------------------------------------------------------------------------
    def current():
        s = snap.current
        if s is None:
            why = f" (last error: {snap.error})" if snap.error else ""
            abort(_json_error(503, f"the first status refresh has not finished yet; retry in a moment{why}",
                              retry_after=2))
        return s

    def render(s, template: str, key: tuple, build: Callable[[dict, float], dict], partial: bool):
        """(raw, gzipped) of a page or only its live part, rendered once per snapshot version."""
        def make() -> bytes:
            now = clock()
            return render_template(template, partial=partial, snap=s, now=now, refresh_error=snap.error,
                                   config_note=model.config_view(s.status, now),
                                   actions=bool(st.token and st.lab), **build(s.status, now)).encode()
        return s.cached((template, key, partial), make)

    def send(pair: tuple[bytes, bytes], mimetype: str) -> Response:
        """The gzipped copy to clients that take it (browsers, requests, curl --compressed)."""
        gz = "gzip" in request.accept_encodings
        resp = Response(pair[1] if gz else pair[0], mimetype=mimetype)
        if gz:
            resp.headers["Content-Encoding"] = "gzip"
        resp.headers["Vary"] = "Accept-Encoding"
        return resp

    def page(template: str, key: tuple, build: Callable[[dict, float], dict]) -> Response:
        return send(render(current(), template, key, build, request.args.get("partial") == "1"), "text/html")

    def metrics_of(s):
        return s.cached("metrics", lambda: metrics_mod.render_status(s.status, clock()))

    def warm(s) -> None:
        """Pre-render what every open browser and scraper polls, before the snapshot is published."""
        with app.test_request_context("/"):
            for partial in (True, False):
                render(s, "overview.html", (), overview_ctx, partial)
        metrics_of(s)

    snap.warmers.append(warm)

    # -- pages -------------------------------------------------------------------------------
    @app.get("/")
    def overview():
        return page("overview.html", (), overview_ctx)

    @app.get("/hosts")
    def hosts():
        def build(status, now):
            st = model.read(status, now)  # read once for the page
            return {"hosts": [model.guarded(lambda h=h: model.host_view(h, st, now),
                                            {"name": h.name, "gpu_rows": [], "running": []}) for h in st.hosts]}
        return page("hosts.html", (), build)

    @app.get("/runs/<run_id>")
    def run_page(run_id: str):
        s = current()
        run = _find_run(s.status, run_id)
        if run is None:
            abort(404)

        def build(status, now):
            tail, tail_note = _log_tail(st, status, run)
            ctx = model.guarded(lambda: charted(model.run_view(model.read(status, now).run(run_id), now)),
                                {"phases": [], "charts": [], "preflight": [], "exit": str(run.get("state")), "cell": None})
            return {"run": run, "tail": tail, "tail_note": tail_note, **ctx}
        return page("run.html", (run_id,), build)

    @app.get("/stages/<name>")
    def stage_page(name: str):
        for stg in model.read(current().status, clock()).stages:
            if stg.name == name and stg.latest_run:
                return redirect(url_for("run_page", run_id=stg.latest_run))
        abort(404)

    # -- API ---------------------------------------------------------------------------------
    @app.get("/api/status")
    def api_status():
        s = current()
        if request.if_none_match and s.etag.strip('"') in request.if_none_match:
            return Response(status=304, headers={"ETag": s.etag})
        resp = send((s.body, s.body_gz), "application/json")
        resp.headers.update({"ETag": s.etag, "Cache-Control": "no-cache"})
        return resp

    @app.get("/api/runs/<run_id>")
    def api_run(run_id: str):
        s = current()
        run = _find_run(s.status, run_id)
        if run is None:
            return _json_error(404, f"no run {run_id!r}")

        def build() -> bytes:
            tail, note = _log_tail(st, s.status, run)
            return json.dumps({"schema": 1, "run": run, "log_tail": tail, "log_tail_note": note},
                              separators=(",", ":"), default=str).encode()
        return send(s.cached(("api_run", run_id), build), "application/json")

    @app.get("/metrics")
    def metrics():
        return send(metrics_of(current()), "text/plain; version=0.0.4; charset=utf-8")

    @app.get("/healthz")
    def healthz():
        return Response("ok\n", mimetype="text/plain")

    @app.post("/api/stages/<name>/rerun")
    def rerun(name: str):
        require_action_token()
        lab = action_lab()
        if name not in lab.cfg.stages:
            return _json_error(404, f"no stage {name!r}; stages: {', '.join(lab.cfg.stages)}")
        out = io.StringIO()
        return _in_background(lambda: lab.run(name, force=True, wait=False, out=out), out, snap)

    @app.post("/api/runs/<run_id>/stop")
    def stop(run_id: str):
        require_action_token()
        lab = action_lab()
        run = _find_run(current().status, run_id)
        if run is None:
            return _json_error(404, f"no run {run_id!r}")
        if run.get("state") not in (RunState.RUNNING, RunState.PENDING, StageState.STALLED):
            return _json_error(409, f"{run_id} is not running ({run.get('state')})")
        return _in_background(lambda: lab.stop(run_id), io.StringIO(), snap)

    @app.errorhandler(404)
    def not_found(e):
        if request.path.startswith("/api/"):
            return _json_error(404, "not found")
        return render_template("error.html", code=404, message="Nothing here: no such page, run or stage."), 404

    @app.errorhandler(500)
    def server_error(e):
        return render_template("error.html", code=500, message="The page failed; the API may still answer."), 500


def charted(view: dict) -> dict:
    """A run page's view with its metric plots drawn."""
    return {**view, "charts": [{**m, "svg": svg.line_chart(m["points"], title=m["name"], x_label="step",
                                                            y_label=m["name"].rsplit("/", 1)[-1], y_from_zero=False)}
                               for m in view["plots"]]}


def overview_ctx(status: dict, now: float) -> dict:
    st = model.read(status, now)  # the snapshot's JSON read once: every view below takes the object
    ov = model.overview(st, now)
    tl = model.timeline(st, now)
    plots = [{**p, "svg": svg.line_chart(p["points"], title=p["title"], x_label=p["x_label"],
                                         y_label=p["y_label"], css_class="chart rate")}
             for p in model.rate_plots(st, now)]
    return {"ov": ov, "tl": tl, "gantt": svg.gantt(tl), "plots": plots, "profile": status.get("profile")}


READ_COOKIE = "eaglelab_read"


def read_credential(token: str) -> str:
    """What the read cookie holds: derived from the token one way (HMAC-SHA256), so it opens the
    page for reading and nothing else: the token cannot be recovered from it to act."""
    return hmac.new(token.encode(), b"eaglelab read cookie v1", hashlib.sha256).hexdigest()


def host_name(host: str) -> str:
    """The name in a Host header, without the port (IPv6 brackets dropped), lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _find_run(status: dict, run_id: str) -> dict | None:
    """Only ids the registry knows are looked up: a URL never names a path."""
    for r in status.get("runs") or []:
        if isinstance(r, dict) and r.get("id") == run_id:
            return r
    return None


def _log_tail(st: WebState, status: dict, run: dict) -> tuple[list[str], str]:
    if st.lab is None:
        return [], "no lab: logs are not available"
    host = model.read(status, 0.0).host(run.get("host"))
    if host is not None and host.reachable is False:
        return [], f"host {run.get('host')} is unreachable: the log cannot be read now"
    try:
        size = int(run.get("log_size") or 0)
        ex = st.lab.executor(run["host"])
        data = ex.read_log(run["id"], max(0, size - LOG_TAIL_BYTES) if size else 0, LOG_TAIL_BYTES * 16)
        if not size and len(data) > LOG_TAIL_BYTES:
            data = data[-LOG_TAIL_BYTES:]
        return model.log_tail(data), ""
    except Exception as e:  # noqa: BLE001 - a log we cannot read is said, not raised
        return [], f"log not readable: {type(e).__name__}: {e}"[:300]


def _in_background(action: Callable[[], dict], out: io.StringIO, snap: Snapshot) -> Response:
    """Run an action (it may wait for a service or an ssh round trip); answer with its result if it
    ends within ACTION_WAIT_S, else 202 and let it finish."""
    box: dict = {}

    def work():
        try:
            box["rec"] = action()
        except Exception as e:  # noqa: BLE001 - reported to the caller
            box["error"] = str(e)
        finally:
            snap.poke()

    t = threading.Thread(target=work, name="web-action", daemon=True)
    t.start()
    t.join(ACTION_WAIT_S)
    if t.is_alive():
        return jsonify({"accepted": True, "done": False, "log": out.getvalue()}), 202
    if "error" in box:
        return _json_error(409, box["error"])
    rec = box.get("rec") or {}
    return jsonify({"accepted": True, "done": True, "run": {k: rec.get(k) for k in ("id", "stage", "host", "state")},
                    "log": out.getvalue()})


def _json_error(code: int, message: str, retry_after: int | None = None) -> Response:
    resp = jsonify({"error": message})
    resp.status_code = code
    if retry_after:
        resp.headers["Retry-After"] = str(retry_after)
    return resp
