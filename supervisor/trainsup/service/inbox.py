"""Owns the inbox: a project file dropped into ``STATE/inbox/`` (``scp lora.yaml box:/var/lib/trainsup/inbox/``)
is queued like ``trainsup queue add``.

The dropped file is the user's, so it is moved, never deleted: to ``inbox/added/ID-NAME.yaml`` once
queued, or to ``inbox/rejected/NAME.yaml`` beside ``NAME.yaml.error`` (what is wrong with it) when it
is not a valid project: not UTF-8 text (see ``record.textfile``), a binary file, a project already
queued or running, or anything else that goes wrong with that one file (the daemon goes on). A file
still being written (changed within the last ``QUIET_S``) waits for the next look; editors' and
scp's temporary names are passed over.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from ..record.fsutil import atomic_write_text
from ..record.journal import Journal
from ..sensors.watch import is_temp_name
from .queuestore import QueueError, QueueStore

SUFFIXES = (".yaml", ".yml")
QUIET_S = 0.5


def take(store: QueueStore, journal: Journal, say: Callable[[str], None], now: Callable[[], float] = time.time) -> bool:
    """Queue every settled project file in the inbox; True when some file must be looked at again."""
    again = False
    try:
        files = sorted(p for p in store.inbox.iterdir() if p.suffix in SUFFIXES and p.is_file()
                       and not is_temp_name(p.name) and not p.name.startswith("."))
    except OSError:
        return False
    for path in files:
        try:
            if now() - path.stat().st_mtime < QUIET_S:
                again = True
                continue
        except OSError:
            continue  # gone meanwhile
        try:
            entry = store.add(path)
        except QueueError as exc:
            _reject(store, journal, say, path, str(exc))
            continue
        except Exception as exc:  # noqa: BLE001 - one file, however bad, never takes the daemon down
            _reject(store, journal, say, path, f"{path}: cannot be queued ({type(exc).__name__}: {exc})")
            continue
        try:
            kept = _move(path, store.inbox / "added", f"{entry.id}-{path.name}")
        except OSError as exc:
            say(f"inbox: {path.name} queued as {entry.id} but cannot be moved to inbox/added/ "
                f"({exc.strerror or exc}); remove it from the inbox")
            continue
        journal.event("inbox_added", file=path.name, id=entry.id, project=entry.project, moved_to=str(kept))
        say(f"inbox: {path.name} queued as {entry.id}")
    return again


def _reject(store: QueueStore, journal: Journal, say: Callable[[str], None], path: Path, error: str) -> None:
    """Move ``path`` to ``inbox/rejected/`` beside ``NAME.error`` saying why; a file that cannot even be
    moved stays where it is (said once per look), and the daemon goes on."""
    try:
        rejected = _move(path, store.inbox / "rejected", path.name)
    except OSError as exc:
        say(f"inbox: {path.name} is not queued: {error}; and it cannot be moved to inbox/rejected/ "
            f"({exc.strerror or exc}): remove it from the inbox")
        return
    try:
        atomic_write_text(rejected.with_name(rejected.name + ".error"), f"{error}\n")
    except OSError:
        pass
    journal.event("inbox_rejected", file=path.name, moved_to=str(rejected), error=error)
    say(f"inbox: {path.name} is not queued: {error} (moved to {rejected})")


def _move(path: Path, folder: Path, name: str) -> Path:
    folder.mkdir(mode=0o700, exist_ok=True)
    target = folder / name
    n = 1
    while target.exists():  # never replace an earlier drop of the same name
        n += 1
        target = folder / f"{Path(name).stem}.{n}{Path(name).suffix}"
    os.replace(path, target)
    return target
