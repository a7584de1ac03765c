"""Owns small file-system primitives: atomic replace of derived files, copy-or-link of weights, and
moving a file or folder out of the way without ever landing on another."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def _replace_via_temp(dst: Path, fill: Callable[[str], None]) -> None:
    """Fill a temp file beside ``dst`` and ``os.replace`` it: readers see old or new, never half."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        fill(tmp)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    def fill(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")

    _replace_via_temp(path, fill)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    def fill(tmp: str) -> None:
        Path(tmp).write_bytes(data)

    _replace_via_temp(path, fill)


def publish_copy(src: Path, dst: Path) -> None:
    """Make ``dst`` hold ``src``'s bytes, atomically; a hard link when possible (no extra space)."""

    def fill(tmp: str) -> None:
        os.unlink(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)

    _replace_via_temp(dst, fill)


def _free(path: Path) -> Path:
    """``path``, or ``path.1``, ``path.2``, ... : the first name not taken."""
    candidate, n = path, 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


def move_into(path: Path, folder: Path) -> Path:
    """Move a file or state dir into ``folder`` (created), never over anything; returns where it went."""
    folder.mkdir(parents=True, exist_ok=True)
    target = _free(folder / path.name)
    shutil.move(str(path), str(target))  # a rename on one file system, copy-and-delete across two
    return target


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """``dst`` as a hard link of ``src`` (no extra space), or a copy across file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
