"""watchdog glue: wake a waiting thread when something in a watched directory changes."""

from __future__ import annotations

import threading
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

# Files whose changes matter: the log, and the files that say how the run ended or lives.
WATCHED_NAMES = frozenset(("output.log", "exit.json", "meta.json"))


class _Wake(FileSystemEventHandler):
    def __init__(self, event: threading.Event, names: frozenset[str] | None) -> None:
        self.event = event
        self.names = names

    def on_any_event(self, ev: FileSystemEvent) -> None:
        if ev.event_type in ("opened", "closed_no_write"):
            return
        if self.names is None:
            self.event.set()
            return
        for p in (ev.src_path, getattr(ev, "dest_path", "")):
            if p and Path(p if isinstance(p, str) else p.decode()).name in self.names:
                self.event.set()
                return


class DirWatch:
    def __init__(self) -> None:
        self.observer = Observer()
        self.observer.daemon = True
        self._started = False

    def add(self, directory: Path, event: threading.Event, names: frozenset[str] | None = WATCHED_NAMES,
            recursive: bool = False) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.observer.schedule(_Wake(event, names), str(directory), recursive=recursive)
        if not self._started:
            self.observer.start()
            self._started = True

    def stop(self) -> None:
        if self._started:
            self.observer.stop()
            self.observer.join(timeout=5)
