"""Owns what the output dir shows of an sd-scripts run: the names an uninterrupted run would write.

Saves trainsup asked for on its own account (the epoch states an exact resume needs, a resumed
attempt's saves under its ``NAME-trainsupN`` name) are moved into ``RUN_DIR/saves/``. A save that
holds a step the user's command saves at is published under its true name: hard links of its files
(copies across file systems), the state's ``train_state.json`` rewritten with the true step. A name
that exists is never replaced, unless it is a save this run left incomplete (a trainer killed
mid-save), which is first moved to ``RUN_DIR/set-aside/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from ...record.fsutil import link_or_copy, move_into, publish_copy
from ...trainers.accelerate import check_safetensors
from .states import check_state


class Publisher:
    """Publishes and hides the saves of one run's attempts (one per run)."""

    def __init__(self, output_dir: Path, run_dir: Path, run_started: float,
                 event: Callable[..., object], moved: Callable[[Path, Path], None],
                 state_ok: Callable[[Path], bool] = lambda p: check_state(p).ok) -> None:
        self.output_dir, self.run_dir, self.run_started = output_dir, run_dir, run_started
        self.state_ok = state_ok  # whether a state dir is complete (the trainer's dialect)
        self.saves = run_dir / "saves"
        self.event = event  # the journal's: every move is on record
        self.moved = moved  # the ledger follows a state it knows

    def hide(self, path: Path, why: str) -> Path | None:
        if not (path.exists() or path.is_symlink()):
            return None
        target = move_into(path, self.saves)
        self.moved(path, target)
        self.event("save_hidden", dir=str(path), to=str(target), why=why)
        return target

    def _clear_for(self, dst: Path, complete: Callable[[Path], bool]) -> bool:
        """Whether ``dst`` may be written: free, or a save this run left incomplete (set aside)."""
        if not (dst.exists() or dst.is_symlink()):
            return True
        try:
            ours = dst.lstat().st_mtime >= int(self.run_started)
        except OSError:
            return False
        if not ours or complete(dst):
            return False  # a complete save of this step is there already, or not ours to touch
        self.set_aside(dst, "incomplete: replaced by a complete save")
        return True

    def set_aside(self, path: Path, why: str) -> Path:
        """Move a save this run left incomplete into ``RUN_DIR/set-aside/`` (never deleted)."""
        target = move_into(path, self.run_dir / "set-aside")
        self.moved(path, target)
        self.event("state_set_aside", dir=str(path), to=str(target), why=why)
        return target

    def weights(self, src: Path, name: str) -> Path | None:
        """Publish a weights file as ``name``; None when the name is taken by a complete file."""
        dst = self.output_dir / name
        if not self._clear_for(dst, lambda p: check_safetensors(p) == "" if p.suffix == ".safetensors"
                               else p.stat().st_size > 0):
            return None
        publish_copy(src, dst)
        self.event("save_published", src=str(src), dst=str(dst))
        return dst

    def state(self, src: Path, name: str, true_step: int) -> Path | None:
        """Publish a state dir as ``name`` with its true step in ``train_state.json`` (a state without
        one, musubi's, keeps the step in its name only)."""
        dst = self.output_dir / name
        if not self._clear_for(dst, self.state_ok):
            return None
        tmp = self.output_dir / f".{name}.trainsup-tmp-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            for f in src.iterdir():
                if f.name == "train_state.json":
                    data = json.loads(f.read_text(encoding="utf-8"))
                    data["current_step"] = true_step
                    (tmp / f.name).write_text(json.dumps(data), encoding="utf-8")
                elif f.is_file():
                    link_or_copy(f, tmp / f.name)
            os.rename(tmp, dst)
        except BaseException:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
            raise
        self.event("save_published", src=str(src), dst=str(dst), step=true_step)
        return dst
