"""Owns noticing edits of the files a run depends on: watchdog events -> one debounced change per save.

Editors save in many ways: vim and VS Code write a temp file and rename it over the target, others
truncate and write, and most raise several events per save plus swap/backup files. Events are
keyed by the target path (a rename's destination counts), temp and swap names are ignored, and a
path is reported once it has been quiet for ``debounce_s``. A report whose content hash equals the
last one reported is dropped, so a save without a change is no change. ``kind`` is ``modified``,
``created`` or ``deleted``.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

_TEMP_SUFFIXES = ("~", ".swp", ".swx", ".swo", ".tmp", ".bak", ".part", ".kate-swp")

ChangeCallback = Callable[[Path, str], None]


def is_temp_name(name: str) -> bool:
    return name.startswith((".", "#")) or name.endswith(_TEMP_SUFFIXES) or name == "4913" \
        or ".tmp." in name or name.endswith(".crswap")


def file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: FileWatcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type in ("opened", "closed_no_write"):
            return
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if raw:
                self.watcher.touch(Path(os.fsdecode(raw)))


class FileWatcher:
    """Watch exact files plus whole trees filtered by suffix (captions), and report debounced changes."""

    def __init__(self, on_change: ChangeCallback, debounce_s: float = 0.1) -> None:
        self.on_change = on_change
        self.debounce_s = debounce_s
        self._files: set[Path] = set()
        self._trees: list[tuple[Path, tuple[str, ...]]] = []
        self._pending: dict[Path, float] = {}
        self._digests: dict[Path, str | None] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._observer = Observer()
        self._thread = threading.Thread(target=self._debounce_loop, name="watch-debounce", daemon=True)
        self._dirs: set[tuple[Path, bool]] = set()

    def watch_file(self, path: Path) -> None:
        path = path.resolve()
        self._files.add(path)
        self._digests[path] = file_digest(path)
        self._schedule(path.parent, recursive=False)

    def watch_tree(self, root: Path, suffixes: Iterable[str]) -> None:
        root = root.resolve()
        sfx = tuple(suffixes)
        self._trees.append((root, sfx))
        for path in root.rglob("*"):
            if path.suffix in sfx and path.is_file():
                self._digests[path] = file_digest(path)
        self._schedule(root, recursive=True)

    def _schedule(self, directory: Path, recursive: bool) -> None:
        if (directory, recursive) in self._dirs or not directory.is_dir():
            return
        self._dirs.add((directory, recursive))
        self._observer.schedule(_Handler(self), str(directory), recursive=recursive)

    def _wanted(self, path: Path) -> bool:
        if is_temp_name(path.name):
            return False
        if path in self._files:
            return True
        return any(path.suffix in sfx and path.is_relative_to(root) for root, sfx in self._trees)

    def touch(self, path: Path) -> None:
        path = Path(os.path.abspath(path))
        if not self._wanted(path):
            return
        with self._lock:
            self._pending[path] = time.monotonic()

    def start(self) -> None:
        self._observer.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._observer.stop()
        self._observer.join(timeout=5)
        self._thread.join(timeout=5)

    def _debounce_loop(self) -> None:
        tick = min(0.02, self.debounce_s / 2) if self.debounce_s > 0 else 0.01
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                ready = [p for p, t in self._pending.items() if now - t >= self.debounce_s]
                for p in ready:
                    del self._pending[p]
            for path in ready:
                self._report(path)

    def _report(self, path: Path) -> None:
        digest = file_digest(path)
        before = self._digests.get(path, "absent")
        if digest == before:
            return  # several events, or a save that changed nothing
        self._digests[path] = digest
        if digest is None:
            kind = "deleted"
        elif before in (None, "absent"):
            kind = "created"
        else:
            kind = "modified"
        self.on_change(path, kind)
