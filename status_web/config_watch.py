"""The page's lab, kept as current as its configuration files: `lab web` runs for days while people
edit conf/, and an action must never run a stage as the files said hours ago.

`check()` compares the bytes of lab.yaml, pipeline.yaml and the profile with what was loaded; when
one changed, the lab is loaded again. A reload that fails keeps the last good lab for reading (the
page stays up, the error in a banner) and `for_action()` refuses with that error until the files
load again. The refresher calls `check()` before each status refresh, the actions `for_action()`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from eaglelab.control.lab import Lab
from eaglelab.errors import ConfigError, EaglelabError
from eaglelab.fsutil import read_regular_file, utcnow_iso


class ConfigStale(Exception):
    """The configuration files changed and do not load: no action until they do."""


def config_files(cfg) -> list[Path]:
    """The files a loaded Config came from (the profile's only when one is in use)."""
    files = [cfg.conf_dir / "lab.yaml", cfg.conf_dir / "pipeline.yaml"]
    if cfg.profile != "none":
        files.append(cfg.conf_dir / "profiles" / f"{cfg.profile}.yaml")
    return files


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(read_regular_file(path)).hexdigest()  # a FIFO put there: never waited on
    except OSError:  # removed, unreadable: a change too (the load will say what is wrong)
        return None


def public_message(e: Exception) -> str:
    """What the page and /api/status may say of a failed load: a ConfigError's public text (file,
    key, line: no value that could be a secret), an eaglelab error's message, else only its kind
    (the whole error goes to the server's stderr for whoever runs it)."""
    import sys

    print(f"lab web: the configuration does not load: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    if isinstance(e, ConfigError):
        return e.public
    if isinstance(e, EaglelabError):
        return e.message
    return f"{type(e).__name__} while loading the configuration; the server's output has the details"


# lab.yaml's web settings the running server took when it started (the address it is bound to, the
# Host names it answers, the variable its token came from): a reload cannot apply them to it.
STARTUP_ONLY = ("host", "port", "allowed_hosts", "token_env")


def web_changes(started, now) -> list[str]:
    """The keys of lab.yaml's `web:` whose value differs from the one the server started with."""
    return [f"web.{k}" for k in STARTUP_ONLY if getattr(started, k) != getattr(now, k)]


class ConfigWatch:
    """The current Lab of a conf dir. `profile`: None to follow lab.yaml's `profile:` on reload
    (`lab web` without --profile), else that profile stays."""

    def __init__(self, lab, profile: str | None = None, loader: Callable | None = None,
                 clock: Callable[[], float] = time.time):
        self._lab = lab
        self.conf_dir = lab.cfg.conf_dir
        self.profile = profile
        self.clock = clock
        self._loader = loader
        self._seen = self._digests(config_files(lab.cfg))  # what the current lab was loaded from
        self._web = lab.cfg.lab.web  # as the server started: a reload changing it is refused
        self._failed: dict[str, str | None] | None = None  # the files as the failed reload read them
        self.loaded_at = utcnow_iso(clock())
        self.reloaded: dict | None = None  # {"at", "files"}: the last reload that worked
        self.error: dict | None = None  # {"at", "files", "message"}: the files do not load now
        self._lock = threading.Lock()

    @property
    def lab(self):
        return self._lab

    @staticmethod
    def _digests(files: list[Path]) -> dict[str, str | None]:
        return {str(f): _digest(f) for f in files}

    def check(self):
        """The lab, reloaded first if a file changed since it was loaded (or since a failed reload)."""
        with self._lock:
            now_seen = self._digests([Path(p) for p in self._seen])
            if now_seen == self._seen:
                if self.error is not None:  # put back as they were: the loaded lab is current again
                    self.error, self._failed = None, None
                return self._lab
            if now_seen == self._failed:
                return self._lab  # the same broken files: the error stands, no reload every refresh
            changed = [p for p, d in now_seen.items() if d != self._seen.get(p)]
            try:
                lab = self._load()
            except Exception as e:  # noqa: BLE001 - any failure keeps the page up, and is shown
                self._failed = now_seen
                self.error = {"at": utcnow_iso(self.clock()), "files": changed, "message": public_message(e)}
                return self._lab
            web = web_changes(self._web, lab.cfg.lab.web)
            if web:  # never a page half on the old settings (who may open it, act) and half on the new
                self._failed = now_seen
                self.error = {"at": utcnow_iso(self.clock()), "files": changed, "message": (
                    f"{self.conf_dir / 'lab.yaml'}: {', '.join(web)} changed; `lab web` takes its web settings "
                    f"({', '.join(STARTUP_ONLY)}) when it starts: restart it to apply them, or put them back "
                    f"(until then the page serves with the settings it started with and no action runs)")}
                return self._lab
            self._lab = lab
            new_files = config_files(lab.cfg)  # the profile itself may have changed (lab.yaml's `profile:`)
            self._seen = self._digests(new_files)
            changed += [str(f) for f in new_files if str(f) not in now_seen]
            self._failed, self.error = None, None
            self.loaded_at = utcnow_iso(self.clock())
            self.reloaded = {"at": self.loaded_at, "files": changed}
            return lab

    def for_action(self):
        """The lab to act with, the files checked just now; ConfigStale when they do not load."""
        lab = self.check()
        if self.error is not None:
            raise ConfigStale(f"the configuration changed at {self.error['at']} and does not load, so no action "
                              f"runs until it does (the page shows the last good one): {self.error['message']}")
        return lab

    def view(self) -> dict:
        """status["config"]: where the lab came from, the last reload, the error that stands."""
        return {"conf_dir": str(self.conf_dir), "files": list(self._seen), "loaded_at": self.loaded_at, "reloaded": self.reloaded,
                "error": self.error}

    def _load(self):
        if self._loader is not None:
            return self._loader(str(self.conf_dir), self.profile)
        return Lab.load(str(self.conf_dir), self.profile)
