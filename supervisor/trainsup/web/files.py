"""Owns which files the page may serve and read: sample images, and the tail of the attempt logs.

A file is served only when its real path (symlinks resolved) lies inside one of the run's roots: its
run dir and the sample dirs its trainer named in ``run_start``. ``..``, an absolute path, a symlink
that leads out and anything that is not a regular file are refused, and so is a file over
``MAX_FILE``. Nothing here raises on a missing or unreadable file: it is reported as absent.

The log tail reads the last ``TAIL_BYTES`` of the newest attempt logs (across attempts, oldest first),
keeps what a terminal would show of a progress bar redrawn with ``\\r`` (its last state), drops
ANSI colour codes, and lays each line out for 100 columns as the console does (``record.readable``:
a rich record's padding to the trainer's 250 collapsed; the log itself keeps every byte).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..commands.runref import attempt_logs
from ..record.readable import readable_line

MAX_FILE = 32 * 1024 * 1024
TAIL_BYTES = 64 * 1024
TAIL_LINES = 200
MAX_SAMPLES = 48
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp",
               ".gif": "image/gif"}
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


class Refused(Exception):
    """A file the page will not serve; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def inside(path: Path, roots: Iterable[Path]) -> bool:
    for root in roots:
        try:
            path.relative_to(root)
            return True
        except ValueError:
            continue
    return False


def safe_file(roots: Sequence[Path], relative: str) -> Path:
    """The file ``relative`` names under one of ``roots``, or ``Refused``.

    ``relative`` is ``ROOT_INDEX/PATH`` as ``file_url`` writes it."""
    first, _, rest = relative.partition("/")
    if not first.isdigit() or int(first) >= len(roots) or not rest:
        raise Refused(404, "no such file")
    parts = Path(rest).parts
    if Path(rest).is_absolute() or any(p in ("..", "") for p in parts) or "\x00" in rest:
        raise Refused(403, "only files inside the run's own directories are served")
    root = roots[int(first)]
    try:
        real_root = root.resolve(strict=True)
        real = (root / rest).resolve(strict=True)
    except (OSError, RuntimeError):
        raise Refused(404, "no such file") from None
    if not inside(real, [real_root]):
        raise Refused(403, "that path leads out of the run's directories")
    try:
        st = real.stat()
    except OSError:
        raise Refused(404, "no such file") from None
    if not stat.S_ISREG(st.st_mode):
        raise Refused(404, "not a file")
    if st.st_size > MAX_FILE:
        raise Refused(413, f"the file is {st.st_size // (1024 * 1024)} MiB, over the page's {MAX_FILE >> 20} MiB")
    return real


def file_url(run_id: str, roots: Sequence[Path], path: Path) -> str | None:
    """The page's URL of ``path`` (under one of ``roots``), or None."""
    for index, root in enumerate(roots):
        try:
            rel = path.relative_to(root)
        except ValueError:
            continue
        return f"/run/{run_id}/file/{index}/{rel.as_posix()}"
    return None


@dataclass(frozen=True)
class SampleFile:
    path: Path
    mtime: float
    label: int | None  # the trainer's step in its name, when the pattern finds one


def sample_files(dirs: Sequence[Path], pattern: re.Pattern[str] | None) -> list[SampleFile]:
    """The newest ``MAX_SAMPLES`` images in ``dirs`` (and their subfolders, one level: OneTrainer
    keeps one a prompt), newest first."""
    found: list[SampleFile] = []
    for folder in dirs:
        for path in _images(folder, depth=2):
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            match = pattern.search(path.name) if pattern else None
            label = int(match.group(1)) if match and match.groups() and match.group(1) else None
            found.append(SampleFile(path, mtime, label))
    found.sort(key=lambda s: (s.mtime, s.path.name), reverse=True)
    return found[:MAX_SAMPLES]


def _images(folder: Path, depth: int) -> list[Path]:
    out: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return out
    for entry in entries:
        try:
            if entry.is_file() and Path(entry.name).suffix.lower() in IMAGE_TYPES:
                out.append(Path(entry.path))
            elif depth > 1 and entry.is_dir(follow_symlinks=False):
                out.extend(_images(Path(entry.path), depth - 1))
        except OSError:
            continue
    return out


def log_tail(run_dir: Path, lines: int = TAIL_LINES) -> list[tuple[int, str]]:
    """The last ``lines`` lines of the run's attempt logs, each with its attempt, oldest first."""
    out: list[tuple[int, str]] = []
    for attempt, path in sorted(attempt_logs(run_dir).items(), reverse=True):
        got = [(attempt, line) for line in _tail(path)]
        out[:0] = got
        if len(out) >= lines:
            break
    return out[-lines:]


def _tail(path: Path) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read(TAIL_BYTES)
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    if size > TAIL_BYTES:
        text = text.partition("\n")[2]  # the first line is cut
    shown = []
    for line in text.split("\n"):
        line = ANSI.sub("", line).rstrip("\r")
        if "\r" in line:  # a bar redrawn in place: what the terminal shows last
            parts = [part for part in line.split("\r") if part.strip()]
            line = parts[-1] if parts else ""
        shown.append(readable_line(line))  # as the console shows it: a 250-column layout read in 100
    while shown and not shown[-1].strip():
        shown.pop()
    return shown
