"""`lab web`: serve the status page (status_web) for this lab."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket

import click

from eaglelab.errors import ConfigError
from status_web import create_app
from status_web import server as web_server


@click.command("web")
@click.option("--host", default=None, help="Address to bind (default: lab.yaml web.host, 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port (default: lab.yaml web.port, 8765).")
@click.option("--refresh", "refresh_s", type=float, default=2.0, show_default=True,
              help="Seconds between background status refreshes (each asks every host once).")
@click.option("--read-token", is_flag=True, help="Require the token for reading too (pages, API, metrics).")
@click.option("--access-log", is_flag=True, help="Log every request (the page polls every 2 s: noisy).")
@click.pass_context
def web(ctx: click.Context, host: str | None, port: int | None, refresh_s: float, read_token: bool,
        access_log: bool) -> None:
    """Serve the status page, /api/status and /metrics (actions need the token in $EAGLELAB_TOKEN)."""
    lab = ctx.obj.lab
    wcfg = lab.cfg.lab.web
    host = host or wcfg.host
    port = wcfg.port if port is None else port
    token = os.environ.get(wcfg.token_env) or None
    if read_token and not token:
        raise ConfigError(f"--read-token needs a token: set ${wcfg.token_env} (lab.yaml web.token_env names the "
                          f"variable)")
    if access_log:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    _check_port(host, port)  # before starting the refresher (the server would exit with its own words)
    # without --profile a reload follows lab.yaml's `profile:` (the config is reloaded when it changes)
    app = create_app(lab, token=token, read_token=read_token, refresh_s=refresh_s, refresher="process",
                     bind_host=host, follow_profile=ctx.obj.profile is None)
    server = web_server.make(app, host, port, access_log=access_log)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"lab web: http://{shown}:{server.effective_port}/ (profile {lab.cfg.profile}; actions "
               f"{'enabled' if token else f'disabled: no ${wcfg.token_env}'}"
               f"{'; reading needs the token' if read_token else ''})", err=True)
    if not _loopback(host):
        click.echo(f"lab web: listening beyond this machine on {host}: anyone who can reach it sees every run, "
                   f"log tail and host{'' if read_token else ' (use --read-token to require the token)'}", err=True)

    def _term(signum, frame):  # a clean exit on TERM too (make, supervisors)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        app.extensions["eaglelab"].snapshot.stop()
        server.close()


def _check_port(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
        try:
            s.bind((host, port))
        except OSError as e:
            raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another with --port "
                              f"or lab.yaml web.port") from None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


COMMANDS = [web]
