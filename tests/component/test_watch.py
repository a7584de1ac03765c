"""The file watcher against real watchdog events from real editor-style saves."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from tests.conftest import wait_until
from trainsup.sensors.watch import FileWatcher


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, path: Path, kind: str) -> None:
        with self.lock:
            self.changes.append((path.name, kind))


def started(tmp_path: Path, rec: Recorder) -> tuple[FileWatcher, Path, Path]:
    target = tmp_path / "prompts.txt"
    target.write_text("one\n")
    data = tmp_path / "data" / "1_x"
    data.mkdir(parents=True)
    (data / "a.txt").write_text("cap a")
    w = FileWatcher(rec, debounce_s=0.1)
    w.watch_file(target)
    w.watch_tree(tmp_path / "data", (".txt",))
    w.start()
    return w, target, data


def test_rename_over_truncate_write_and_delete_each_report_once(tmp_path: Path) -> None:
    rec = Recorder()
    w, target, _ = started(tmp_path, rec)
    try:
        swap = tmp_path / ".prompts.txt.swp"  # vim's swap file and VS Code's temp are not changes
        swap.write_text("two\n")
        os.replace(swap, target)
        wait_until(lambda: rec.changes == [("prompts.txt", "modified")], 5, what="rename-over")
        with open(target, "r+") as fh:  # truncate, then write in several pieces
            fh.truncate(0)
            fh.flush()
            for piece in ("th", "ree", "\n"):
                fh.write(piece)
                fh.flush()
        wait_until(lambda: len(rec.changes) == 2, 5, what="in-place write")
        target.write_text("three\n")  # saved again without a change: no report
        target.unlink()
        wait_until(lambda: len(rec.changes) == 3, 5, what="delete")
        time.sleep(0.3)
        assert rec.changes == [("prompts.txt", "modified"), ("prompts.txt", "modified"), ("prompts.txt", "deleted")]
    finally:
        w.stop()


def test_caption_trees_are_watched_and_other_files_ignored(tmp_path: Path) -> None:
    rec = Recorder()
    w, _, data = started(tmp_path, rec)
    try:
        (data / "a.txt").write_text("cap a, edited")
        (data / "a.png").write_bytes(b"not a caption")
        (data / "a.txt~").write_text("backup")
        (data / "b.txt").write_text("new caption")
        wait_until(lambda: len(rec.changes) >= 2, 5, what="caption changes")
        time.sleep(0.3)
        assert sorted(rec.changes) == [("a.txt", "modified"), ("b.txt", "created")]
    finally:
        w.stop()
