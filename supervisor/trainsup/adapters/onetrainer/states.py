"""Owns OneTrainer's resume points: the backups in ``WORKSPACE/backup/`` (listing, claiming the
complete ones an attempt wrote, which may be resumed from), clearing ``backup/`` for a resume, and
the final model file.

OneTrainer's ``continue_last_backup`` takes the lexicographically last *directory* in ``backup/``
and checks nothing. So before a resume from backup B, every directory there that sorts after B and
every incomplete backup is moved into ``RUN_DIR/set-aside/attempt-N/`` (journaled ``state_set_aside``;
nothing is deleted): B is then the one OneTrainer takes. The end backup (``epoch == epochs``) is
never resumed from: OneTrainer trains nothing from it and saves no model (the README's failed
final save), so the one before it is resumed instead. A resume writes a second backup of the
resumed step under a new timestamp at once; an uninterrupted run has one backup of that step, so the
copy is moved into ``RUN_DIR/saves/`` (journaled ``save_hidden``) and ``backup/`` keeps the names an
uninterrupted run makes (the step in each name, the timestamps aside).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ...record.fsutil import move_into
from ...record.journal import Journal
from ...record.ledger import Ledger, StateRecord
from ...record.textfmt import shown_path
from ...trainers.base import Plan
from ...trainers.stepstates import StepStates, newest_mtime
from .backups import backup_problem, parse_name


class OTStates(StepStates):
    announce_on_claim = False  # said after a second backup is hidden (``collect``): where the state stays

    def __init__(self, ledger: Ledger, journal: Journal, say: Callable[[str], None], workspace: Path,
                 output: Path | None, epochs: Callable[[Plan | None], int | None], lora: bool,
                 saved_seen: Callable[[], bool], allowed: Callable[[StateRecord, Plan | None], bool],
                 run_dir: Path) -> None:
        super().__init__(ledger, journal, say, self._find, self._check, final=self._final, publish=self._publish)
        self.workspace, self.output, self.epochs, self.lora = workspace, output, epochs, lora
        self.saves = run_dir / "saves"
        self.saved_seen, self.allowed = saved_seen, allowed  # allowed: the adapter's say (a NaN remedy)
        self._cache: dict[Path, tuple[tuple[tuple[int, int], ...], str]] = {}

    @property
    def backup_dir(self) -> Path:
        return self.workspace / "backup"

    def _find(self) -> list[tuple[Path, int]]:
        found: list[tuple[Path, int]] = []
        try:
            names = sorted(os.listdir(self.backup_dir))
        except OSError:
            return found
        for name in names:
            parsed = parse_name(name)
            if parsed is not None and (self.backup_dir / name).is_dir():
                found.append((self.backup_dir / name, parsed.step))
        return found

    def collect(self, only: Path | None = None) -> list[StateRecord]:
        recorded = super().collect(only)
        for state in recorded:
            if self._repeats_resume_origin(state):
                self._hide(state)
            else:
                self.announce(state)
        return recorded

    def _repeats_resume_origin(self, state: StateRecord) -> bool:
        """A resumed attempt's backup of the step it resumed from, beside the one it resumed from."""
        if not self.resume_step or state.attempt != self.attempt or state.step != self.resume_step:
            return False
        return any(s.step == state.step and s.dir != state.dir and Path(s.dir).parent == self.backup_dir
                   for s in self.ledger.states)

    def _hide(self, state: StateRecord) -> None:
        path = Path(state.dir)
        target = move_into(path, self.saves)
        self.ledger.moved(path, target)
        self.journal.event("save_hidden", dir=str(path), to=str(target), step=state.step,
                           why="OneTrainer backs up the step it resumed from again, under a new time")
        self.say(f"step {state.step} is saved again (OneTrainer backs up the step it resumed from once more); "
                 f"this copy is kept out of sight in {shown_path(target)}")

    def _check(self, path: Path) -> str:
        key = _stamp(path)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        verdict = backup_problem(path, self.lora)
        self._cache[path] = (key, verdict)
        return verdict

    def newest(self, nan_step: int | None = None, max_steps: int | None = None, plan: Plan | None = None,
               accept: Callable[[StateRecord], bool] = lambda _state: True) -> StateRecord | None:
        """The newest safe backup; among two of one step (a resume re-saves it), the later name."""
        best = super().newest(nan_step, max_steps, plan, accept)
        if best is None:
            return None
        same = [s for s in self.ledger.states if s.step == best.step and s.dir not in self.ledger.bad_states
                and self.resumable(s, max_steps, plan) and not self._check(Path(s.dir))]
        return max(same, key=lambda s: Path(s.dir).name, default=best)

    def resumable(self, state: StateRecord, max_steps: int | None, plan: Plan | None = None) -> bool:
        parsed = parse_name(Path(state.dir).name)
        epochs = self.epochs(plan)
        return (parsed is not None and (epochs is None or parsed.epoch < epochs) and self.allowed(state, plan)
                and Path(state.dir).parent == self.backup_dir)  # OneTrainer resumes from backup/ only

    def clear_for_resume(self, resume: Path, run_dir: Path, attempt: int) -> list[str]:
        """Move every directory in ``backup/`` that OneTrainer would take instead of ``resume`` (it
        sorts after it) and every incomplete backup into ``RUN_DIR/set-aside/attempt-N/``."""
        moved: list[str] = []
        try:
            names = sorted(os.listdir(self.backup_dir))
        except OSError:
            return moved
        for name in names:
            path = self.backup_dir / name
            if path == resume or not path.is_dir():
                continue
            if name > resume.name:
                why = f"it sorts after {resume.name}, and OneTrainer resumes from the last name"
            else:
                problem = self._check(path) if parse_name(name) is not None else ""
                if not problem:
                    continue
                why = f"incomplete: {problem}"
            moved.append(self._set_aside(path, run_dir, attempt, why))
        return moved

    def _set_aside(self, path: Path, run_dir: Path, attempt: int, why: str) -> str:
        target = run_dir / "set-aside" / f"attempt-{attempt}" / path.name
        n = 1
        while target.exists():
            n += 1
            target = target.with_name(f"{path.name}.{n}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
        step = self.ledger.step_of(path)
        self.ledger.states = [r for r in self.ledger.states if r.dir != str(path)]
        self.ledger.bad_states = [d for d in self.ledger.bad_states if d != str(path)]
        self.ledger.mark_bad(target)
        self.journal.event("state_set_aside", dir=str(path), step=step, to=str(target), attempt=attempt,
                           reason=why)
        self.say(f"{shown_path(path)} is moved to {shown_path(target)} ({why})")
        return str(path)

    def _final(self) -> Path | None:
        """The output model, when this attempt printed ``Saving <it>`` (else nothing counts)."""
        return self.output if self.output is not None and self.saved_seen() else None

    def _publish(self) -> str | None:
        """OneTrainer writes the model where the config says; nothing to move."""
        return str(self.output) if self.final_written() else None

    def final_written(self) -> bool:
        final = self._final()
        return final is not None and final.is_file() and newest_mtime(final) >= int(self.attempt_started)


def _stamp(path: Path) -> tuple[tuple[int, int], ...]:
    """Size and mtime of every file of a backup: a verdict holds while none of them changes."""
    out: list[tuple[int, int]] = []
    try:
        for f in sorted(path.rglob("*")):
            if f.is_file():
                st = f.stat()
                out.append((st.st_size, st.st_mtime_ns))
    except OSError:
        return ()
    return tuple(out)
