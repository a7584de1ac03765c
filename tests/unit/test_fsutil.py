"""record.fsutil's temp-and-replace writes: the file holds the old bytes or the new, never part, and no
temp file is left beside it (a trainer that re-reads a prompt file mid-write sees one or the other)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsup.record import fsutil


def test_bytes_replace_the_file_whole_and_leave_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "attempt-2" / "prompts.txt"  # its folder is made
    fsutil.atomic_write_bytes(path, b"a cat\n")
    fsutil.atomic_write_bytes(path, b"a dog\xff\n")
    assert path.read_bytes() == b"a dog\xff\n"
    assert [p.name for p in path.parent.iterdir()] == ["prompts.txt"]


def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "prompts.txt"
    fsutil.atomic_write_text(path, "old\n")

    def refuse(src: str, dst: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "replace", refuse)
    with pytest.raises(OSError):
        fsutil.atomic_write_bytes(path, b"new\n")
    assert path.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["prompts.txt"]
