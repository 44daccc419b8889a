"""The HTTP server `lab web` runs (and bench/bench_web.py measures): waitress, a production WSGI
server with a fixed pool of worker threads, a cap on open connections and an idle timeout, so a
LAN full of idle or slow clients cannot grow threads without bound (werkzeug's dev server made
one thread per connection: 1,000 idle connections left 1,003 threads). Requests only read bytes
the refresher process prepared (snapshot.py), so a few threads serve many pollers."""

from __future__ import annotations

import logging
import re
import time

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import TcpWSGIServer

THREADS = 8  # worker threads: each request is a dict lookup and a write
CONNECTION_LIMIT = 200  # open connections; at the limit a new one evicts the longest-waiting unserved one
CHANNEL_TIMEOUT_S = 30  # an idle connection (keep-alive, no request) is closed after this
REQUEST_READ_S = 10  # a request must arrive whole (headers and body) within this of its first byte
PER_CLIENT_UNSERVED = 32  # connections one address may hold with no request being served (a browser: ~6)
ACCESS_LOG = logging.getLogger("eaglelab.web.access")
_TOKEN_ARG = re.compile(r"(^|&)(token=)[^&]*", re.IGNORECASE)
# What a client may put in a path (waitress decodes %0A) that could start a forged line or field
# of the access log: controls, DEL, C1, the Unicode line breaks, the space, the backslash.
_UNSAFE = re.compile(r"[\x00-\x20\x7f-\x9f\\\u2028\u2029]")


class GuardedChannel(HTTPChannel):
    """A connection that knows since when it has been receiving its current request."""

    reading_since: float | None = None  # the first byte of the request not yet complete; None: none

    def received(self, data):
        began = time.time() if self.request is None else self.reading_since
        out = super().received(data)
        self.reading_since = None if self.request is None else (self.reading_since or began or time.time())
        return out

    @property
    def unserved(self) -> bool:
        """No request of it is being answered: it is idle or still sending one."""
        return not self.requests and not self.total_outbufs_len

    def waiting_since(self) -> float:
        return self.reading_since or self.last_activity


class GuardedServer(TcpWSGIServer):
    """waitress with slowloris bounds (a client that sends a header line every few seconds kept
    waitress's every connection for minutes, its idle timeout being reset by each line):
    - a request must arrive whole within REQUEST_READ_S of its first byte, or its connection closes;
    - one address holds at most PER_CLIENT_UNSERVED connections that are idle or still sending:
      past that, its longest-waiting one is closed;
    - at CONNECTION_LIMIT a new connection is still accepted, and the longest-waiting unserved
      connection is closed for it, so a client that sends its request at once is always answered."""

    channel_class = GuardedChannel

    def readable(self):
        super().readable()  # its maintenance (timeouts) runs; accepting never pauses
        return self.accepting

    def maintenance(self, now):
        super().maintenance(now)
        for channel in list(self.active_channels.values()):
            since = getattr(channel, "reading_since", None)
            if since is not None and now - since > REQUEST_READ_S and not channel.requests:
                channel.will_close = True

    def _evict(self, channels) -> bool:
        """Close the unserved channel among these that has waited longest; False if none."""
        waiting = [c for c in channels if isinstance(c, GuardedChannel) and c.unserved and not c.will_close]
        if not waiting:
            return False
        min(waiting, key=GuardedChannel.waiting_since).handle_close()
        return True

    def handle_accept(self):
        try:
            v = self.accept()
            if v is None:
                return
            conn, addr = v
            self.set_socket_options(conn)
        except OSError:
            return
        addr = self.fix_addr(addr)
        if len(self.active_channels) >= self.adj.connection_limit and not self._evict(self.active_channels.values()):
            conn.close()  # every connection is being answered: this one waits for none of them
            return
        channel = self.channel_class(self, conn, addr, self.adj, map=self._map)
        mine = [c for c in self.active_channels.values() if c is not channel and c.addr[:1] == addr[:1]
                and isinstance(c, GuardedChannel) and c.unserved]
        if len(mine) >= PER_CLIENT_UNSERVED:
            self._evict(mine)


def make(app, host: str, port: int, access_log: bool = False):
    """A waitress server bound to host:port (not yet serving: call .run(); .close() to end).
    `.effective_port` is the bound port."""
    adj = Adjustments(host=host, port=port, threads=THREADS, connection_limit=CONNECTION_LIMIT,
                      channel_timeout=CHANNEL_TIMEOUT_S, cleanup_interval=1, asyncore_use_poll=True,
                      ident="eaglelab", clear_untrusted_proxy_headers=True)
    return GuardedServer(AccessLog(app) if access_log else app, adj=adj)


def printable(text: str) -> str:
    """text for one field of one log line: what could end the line or the field as \\xNN."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                       text)


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
            ACCESS_LOG.info("%s %s %s%s %s %.1fms", printable(str(environ.get("REMOTE_ADDR", "-"))),
                            printable(str(environ.get("REQUEST_METHOD"))), printable(environ.get("PATH_INFO", "")),
                            f"?{printable(q)}" if q else "", seen.get("status", "-"),
                            (time.perf_counter() - began) * 1000)
