"""Owns the default state store: "states are directories matching a pattern, named with their
true step, complete when these files are there" (LitGPT's ``step-000010/``, a declarative
``checkpoint-*`` glob, the diffusers scripts' ``checkpoint-N/``): listing them, claiming the
complete ones an attempt wrote into the ledger, choosing the newest safe one, and moving aside what
a resumed attempt would otherwise overwrite.

The adapter says where states are (``find``: path and step of each candidate; ``step_dirs`` and
``globbed`` build one from a name pattern) and when one is complete (``check``: '' or why not;
``files_present`` builds one from file names, ``accelerate.state_problem`` knows accelerate's
states). A state counts for an attempt only when it was written after that attempt's launch (its
newest file), so a same-named state of an earlier run is never claimed. Nothing is ever deleted: a
state in the way of a resume goes to ``RUN_DIR/set-aside/``.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ..record.journal import Journal
from ..record.ledger import AttemptRecord, Ledger, StateRecord
from ..record.textfmt import shown_path
from .base import Launch, Plan
from .ledgerstates import LedgerStates

Find = Callable[[], list[tuple[Path, int]]]
Check = Callable[[Path], str]
_LAST_NUMBER = re.compile(r"(\d+)(?!.*\d)")


def step_dirs(base: Path, name: re.Pattern[str]) -> list[tuple[Path, int]]:
    """The directories directly in ``base`` whose whole name matches ``name`` (group 1: the true
    step), by step."""
    found: list[tuple[Path, int]] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return found
    for entry in entries:
        m = name.fullmatch(entry.name)
        if m is not None and entry.is_dir():
            found.append((Path(entry.path), int(m.group(1))))
    return sorted(found, key=lambda f: f[1])


def globbed(base: Path, pattern: str, step: re.Pattern[str] | None = None) -> Find:
    """``find`` for the paths ``pattern`` (a glob, relative to ``base`` or absolute) matches; a
    state's true step is group 1 of ``step`` searched in its name (default: the name's last number)."""
    absolute = Path(pattern).is_absolute()
    root, rest = (Path("/"), pattern.lstrip("/")) if absolute else (base, pattern)

    def find() -> list[tuple[Path, int]]:
        found = []
        for path in root.glob(rest):
            m = (step or _LAST_NUMBER).search(path.name)
            if m is not None:
                found.append((path.resolve(), int(m.group(1))))
        return sorted(found, key=lambda f: f[1])
    return find


def files_present(names: Iterable[str]) -> Check:
    """``check`` for "complete when these files are inside it" (none: when it exists at all)."""
    wanted = tuple(names)

    def check(path: Path) -> str:
        if not path.exists():
            return "missing"
        for name in wanted:
            if not (path / name).is_file():
                return f"{name} missing"
        return ""
    return check


def newest_mtime(path: Path) -> float:
    """The newest modification time of a file, or of any file inside a directory."""
    try:
        if path.is_file():
            return path.stat().st_mtime
        return max([f.stat().st_mtime for f in path.rglob("*") if f.is_file()] or [path.stat().st_mtime])
    except OSError:
        return 0.0


class StepStates(LedgerStates):
    def __init__(self, ledger: Ledger, journal: Journal, say: Callable[[str], None], find: Find, check: Check,
                 *, resume_at_end: bool = True, final: Callable[[], Path | None] | None = None,
                 publish: Callable[[], str | None] = lambda: None) -> None:
        super().__init__(ledger, journal, say)
        self.find, self.check = find, check
        self.resume_at_end = resume_at_end  # False: never resume from a state at the last step
        self.final, self.publish = final, publish  # final None: exit 0 alone is success
        self.attempt_started = time.time()

    def continue_ledger(self) -> None:
        if not self.ledger.attempts:
            return
        last = self.ledger.attempts[-1]
        self.attempt, self.resume_step = last.attempt, last.resume_step
        self.attempt_started = last.started if last.started is not None else self.attempt_started
        self.collect()

    def begin(self, attempt: int, launch: Launch) -> None:
        self.attempt, self.resume_step = attempt, launch.resume_step
        self.attempt_started = time.time()
        # The step in a state's name is the true step: the label offset is 0.
        self.ledger.attempts.append(AttemptRecord(attempt, launch.output_name, launch.resume_step, 0,
                                                  round(self.attempt_started, 3)))
        self.ledger.save()

    def collect(self, only: Path | None = None) -> list[StateRecord]:
        recorded: list[StateRecord] = []
        for path, step in self.find():
            if only is not None and path != only:
                continue
            if self.ledger.step_of(path) is not None or path.as_posix() in self.ledger.bad_states:
                continue
            if newest_mtime(path) < int(self.attempt_started):
                continue  # an earlier run's state under the same name: not this attempt's to claim
            if self.check(path):
                continue
            state = self.claim(path, step)
            if state is not None:
                recorded.append(state)
        return recorded

    def resumable(self, state: StateRecord, max_steps: int | None, plan: Plan | None = None) -> bool:
        return self.resume_at_end or max_steps is None or state.step < max_steps

    def usable(self, path: Path, nan_step: int | None) -> bool:
        if self.check(path):
            self.ledger.mark_bad(path)
            return False
        return True

    def adopt(self, path: Path) -> str:
        for found, step in self.find():
            if found == path:
                problem = self.check(path)
                if problem:
                    return problem
                self.ledger.states.append(StateRecord(str(path), step, 0, step))
                self.journal.event("state_adopted", dir=str(path), step=step)
                return ""
        return "not a saved state of this trainer"

    def final_written(self) -> bool:
        """Whether this attempt wrote the run's final output (what makes exit 0 a success)."""
        if self.final is None:
            return True
        final = self.final()
        return final is not None and final.exists() and newest_mtime(final) >= int(self.attempt_started)

    def publish_final(self) -> str | None:
        return self.publish()

    def set_aside_after(self, step: int, run_dir: Path, attempt: int, within: Path | None = None) -> list[str]:
        """Move every state past ``step`` (complete or not) out of the trainer's way into the run dir:
        the resumed attempt would write the same names over them. ``within``: only the states in that
        directory (a trainer with one output directory per line of attempts)."""
        moved: list[str] = []
        for path, s in self.find():
            if s <= step or (within is not None and path.parent != within):
                continue
            target = run_dir / "set-aside" / f"attempt-{attempt}" / path.name
            n = 1
            while target.exists():  # two directories' states of one name: keep both
                n += 1
                target = target.with_name(f"{path.name}.{n}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(target))
            # The name is free again: the resumed attempt's own state of that name must be claimable,
            # so forget the old one under its old path and remember it, unusable, where it went.
            self.ledger.states = [r for r in self.ledger.states if r.dir != str(path)]
            self.ledger.bad_states = [d for d in self.ledger.bad_states if d != str(path)]
            self.ledger.mark_bad(target)
            moved.append(str(path))
            self.journal.event("state_set_aside", dir=str(path), step=s, to=str(target), attempt=attempt)
            self.say(f"the state of step {s} is moved to {shown_path(target)}: a resume from step {step} would "
                     "overwrite it")
        return moved
