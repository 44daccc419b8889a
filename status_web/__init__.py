"""status_web: the lab's status page, JSON API and Prometheus metrics (a Flask app factory).

`lab web` serves it (py/eaglelab/control/commands/web.py); `create_app(lab)` builds it for tests and
embedding. Modules: app (routes, tokens), snapshot (background refresh), model (status -> what the
pages show, pure), svg (charts, pure), metrics (/metrics).
"""

from .app import create_app

__all__ = ["create_app"]
