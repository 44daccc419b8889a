"""The HTTP server `lab web` runs (and bench/bench_web.py measures): waitress, a production WSGI
server with a fixed pool of worker threads, a cap on open connections and an idle timeout, so a
LAN full of idle or slow clients cannot grow threads without bound (werkzeug's dev server made
one thread per connection: 1,000 idle connections left 1,003 threads). Requests only read bytes
the refresher process prepared (snapshot.py), so a few threads serve many pollers."""

from __future__ import annotations

import logging
import re
import time

from waitress import create_server

THREADS = 8  # worker threads: each request is a dict lookup and a write
CONNECTION_LIMIT = 200  # open connections past this wait in the listen backlog
CHANNEL_TIMEOUT_S = 30  # an idle (or stalled mid-request) connection is closed after this
ACCESS_LOG = logging.getLogger("eaglelab.web.access")
_TOKEN_ARG = re.compile(r"(^|&)(token=)[^&]*", re.IGNORECASE)


def make(app, host: str, port: int, access_log: bool = False):
    """A waitress server bound to host:port (not yet serving: call .run(); .close() to end).
    `.effective_port` is the bound port."""
    return create_server(AccessLog(app) if access_log else app, host=host, port=port, threads=THREADS,
                         connection_limit=CONNECTION_LIMIT, channel_timeout=CHANNEL_TIMEOUT_S,
                         cleanup_interval=5, asyncore_use_poll=True, ident="eaglelab",
                         clear_untrusted_proxy_headers=True)


def redact_query(query: str) -> str:
    """The query string with any token's value replaced: a token never reaches a log."""
    return _TOKEN_ARG.sub(r"\1\2***", query)


class AccessLog:
    """One line per request (method, path, redacted query, status, ms) to eaglelab.web.access."""

    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        began = time.perf_counter()
        seen = {}

        def start(status, headers, exc_info=None):
            seen["status"] = status.split(" ", 1)[0]
            return start_response(status, headers, exc_info)

        try:
            return self.app(environ, start)
        finally:
            q = redact_query(environ.get("QUERY_STRING", ""))
            ACCESS_LOG.info("%s %s %s%s %s %.1fms", environ.get("REMOTE_ADDR", "-"), environ.get("REQUEST_METHOD"),
                            environ.get("PATH_INFO", ""), f"?{q}" if q else "", seen.get("status", "-"),
                            (time.perf_counter() - began) * 1000)
