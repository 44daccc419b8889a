"""The HTTP server `lab web` runs (and bench/bench_web.py measures): werkzeug's threaded server,
one thread per connection; the page polls over kept-alive connections. Requests only read bytes
that the refresher process prepared (snapshot.py), so a thread per connection is cheap."""

from __future__ import annotations

from werkzeug.serving import BaseWSGIServer, make_server


def make(app, host: str, port: int) -> BaseWSGIServer:
    return make_server(host, port, app, threaded=True)
