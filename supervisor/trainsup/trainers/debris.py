"""Owns what a killed attempt's half-done write leaves next to a trainer's outputs, outside any state:
finding it and moving it into the run dir before the next attempt, so that a run interrupted during
a save ends with the same files as one never interrupted.

safetensors (0.8, every bed here) writes a file atomically: ``DIR/.tmpXXXXXX`` (six letters or digits,
mode 0600) and then a rename over the real name (strace on the real diffusers bed). A trainer killed
inside that write of its final weights, or of any weights file saved straight into its output
directory, leaves the ``.tmp`` file there for good: the resumed attempt writes a new one under a new
random name. Inside a state directory the same file makes the state incomplete (each adapter's
completeness check), and the whole state is set aside instead.

Only a file of exactly that name, directly in an output directory the adapter names, and written
since this run's first attempt began, is this run's debris: a user's own file of that kind from
before the run is never touched. Nothing is deleted; it goes to ``RUN_DIR/set-aside/attempt-N/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from ..record import journalkinds as kinds
from ..record.fsutil import move_into
from ..record.journal import Journal
from ..record.textfmt import shown_path

WRITE_DEBRIS = re.compile(r"\.tmp[A-Za-z0-9]{6}")


def write_debris(dirs: Iterable[Path], since: float) -> list[Path]:
    """The half-done atomic writes directly in ``dirs`` that were written at or after ``since``."""
    found: list[Path] = []
    for base in dict.fromkeys(dirs):  # one scan per directory, in the order given
        try:
            entries = list(os.scandir(base))
        except OSError:
            continue  # not there (yet): nothing left in it
        for entry in entries:
            try:
                if (WRITE_DEBRIS.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_mtime >= int(since)):
                    found.append(Path(entry.path))
            except OSError:
                continue  # gone meanwhile
    return sorted(found)


def set_aside_write_debris(dirs: Iterable[Path], since: float, run_dir: Path, attempt: int, journal: Journal,
                           say: Callable[[str], None]) -> list[str]:
    """Move this run's half-done writes out of ``dirs`` into ``RUN_DIR/set-aside/attempt-N/`` (journaled
    ``state_set_aside``); what could not be moved stays where it is, said once each."""
    moved: list[str] = []
    for path in write_debris(dirs, since):
        try:
            target = move_into(path, run_dir / "set-aside" / f"attempt-{attempt}")
        except OSError as exc:
            say(f"warning: {shown_path(path)}, a write an earlier attempt left unfinished, stays where it is: "
                f"cannot move it into the run dir ({exc.strerror or exc})")
            continue
        moved.append(str(path))
        journal.event(kinds.STATE_SET_ASIDE, dir=str(path), to=str(target), attempt=attempt,
                      why="a write cut short: a killed attempt's temporary file, never renamed to its name")
        say(f"{shown_path(path)}, a weights file an earlier attempt was killed while writing, is moved to "
            f"{shown_path(target)}")
    return moved
