"""Owns the ``declarative`` adapter: any command plus a project file's ``trainer:`` section that
says where its states are, when one is complete, how to resume from one, and what its lines mean.

    trainer:
      states: out/checkpoint-*            # glob for saved states (relative to the project's cwd)
      complete: state.json                # a file inside a state whose presence marks it complete
      step: 'checkpoint-(\\d+)$'          # regex over the state's name; group 1 is its true step
      resume: [--resume_from_checkpoint, '{state}']   # arguments that resume from a state
      progress: 'step (?P<step>\\d+)/(?P<total>\\d+) loss (?P<loss>\\S+)'   # optional
      success: 'training done'            # optional: a line that marks success (else exit 0)
      total_steps: 200                    # optional: the run's length, when progress lacks a total

Without ``resume`` it restarts the command unchanged, like the ``command`` adapter. A resumed
attempt first moves every state past its resume point into the run dir (the trainer would write the
same names over them); a fresh restart moves the earlier attempts' partial states the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..faults.progress import Progress
from ..record.journal import Journal
from ..record.ledger import Ledger, StateRecord
from ..trainers.base import (
    NO_CLAIM,
    ArgvPlan,
    Family,
    Finding,
    Launch,
    OutputFormat,
    Plan,
    Say,
    Setup,
    TrainerRun,
    UsageError,
)
from ..trainers.stepstates import StepStates, files_present, globbed
from .command import CommandRun, output_dir_of

KEYS = ("states", "complete", "step", "resume", "progress", "success", "total_steps")


def _regex(section: Mapping[str, Any], key: str, groups: tuple[str, ...] = ()) -> re.Pattern[str] | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"trainer.{key}: expected a regular expression, got {value!r}")
    try:
        pattern = re.compile(value)
    except re.error as exc:
        raise UsageError(f"trainer.{key}: not a regular expression ({exc}): {value!r}") from None
    missing = [g for g in groups if g not in pattern.groupindex]
    if missing:
        raise UsageError(f"trainer.{key}: needs the named group(s) {', '.join(missing)}: {value!r}")
    return pattern


def _number(m: re.Match[str], group: str) -> float | None:
    if group not in m.re.groupindex or m.group(group) is None:
        return None
    try:
        return float(m.group(group))
    except ValueError:
        return math.nan if m.group(group).lower() == "nan" else None


class DeclaredOutput(OutputFormat):
    def __init__(self, progress: re.Pattern[str] | None, success: re.Pattern[str] | None, total: int | None) -> None:
        self.pattern, self.success, self.total = progress, success, total
        self.progress_hint = "" if progress is not None else None  # every line may carry progress
        self.any_line_is_activity = progress is None
        self.bookkeeping = success  # only lines that may be the success line reach is_success

    def progress(self, line: str) -> Progress | None:
        m = self.pattern.search(line) if self.pattern is not None else None
        if m is None:
            return None
        step = _number(m, "step")
        total = _number(m, "total")
        if step is None or math.isnan(step):
            return None
        return Progress(int(step), int(total) if total and not math.isnan(total) else (self.total or 0),
                        _number(m, "rate"), _number(m, "loss"))

    def is_success(self, line: str) -> bool:
        return self.success is not None and self.success.search(line) is not None


class DeclarativeRun(CommandRun):
    """A command (its remedies, interpreter and doctor are ``command``'s) whose states are declared."""

    family = "declarative"

    def __init__(self, setup: Setup) -> None:
        TrainerRun.__init__(self)
        section = dict(setup.section or {})
        unknown = sorted(set(section) - set(KEYS))
        if unknown:
            raise UsageError(f"trainer.{unknown[0]}: unknown key; the declarative adapter reads "
                             f"{', '.join(KEYS)}")
        self.cwd = setup.cwd
        self.plan = ArgvPlan(list(setup.argv))
        self.output_dir = output_dir_of(setup.argv, setup.cwd)
        self.glob = section.get("states")
        if self.glob is not None and (not isinstance(self.glob, str) or not self.glob):
            raise UsageError(f"trainer.states: expected a glob such as out/checkpoint-*, got {self.glob!r}")
        complete = section.get("complete")
        if complete is not None and (not isinstance(complete, str) or not complete or "/" in complete):
            raise UsageError(f"trainer.complete: expected a file name inside a state, got {complete!r}")
        self.completes = (complete,) if complete is not None else ()  # the files that mark a state complete
        self.step_re = _regex(section, "step")
        if self.step_re is not None and self.step_re.groups < 1:
            raise UsageError("trainer.step: needs one group that captures the step number")
        resume = section.get("resume")
        if resume is not None and (not isinstance(resume, list) or not resume
                                   or not all(isinstance(a, (str, int)) for a in resume)
                                   or not any("{state}" in str(a) for a in resume)):
            raise UsageError(f"trainer.resume: expected a list of arguments with {{state}} in one, got {resume!r}")
        self.resume_args = [str(a) for a in resume] if resume else None
        if self.resume_args and self.glob is None:
            raise UsageError("trainer.resume: needs trainer.states (where the states are)")
        total = section.get("total_steps")
        if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 1):
            raise UsageError(f"trainer.total_steps: expected an integer >= 1, got {total!r}")
        self.total_steps = total
        # States: the globbed paths, their step from the name (the ``states`` store of ``stepstates``).
        self._find = globbed(self.cwd, self.glob, self.step_re) if self.glob is not None else list
        self.success = _regex(section, "success")
        self.output = DeclaredOutput(_regex(section, "progress", ("step",)), self.success, total)
        if self.resume_args is None:
            self.notes.append("trainer: has no resume: every restart relaunches the command unchanged")

    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        self.run_dir = run_dir
        # With a success line, exit 0 without it is not success; without one, exit 0 is.
        self.step_states = StepStates(ledger, journal, say, self._find, files_present(self.completes),
                                      final=None if self.success is None else lambda: None)
        self.states = self.step_states

    def existing_outputs(self) -> list[Path]:
        return [path for path, _step in self._find()]

    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> Launch:
        assert isinstance(plan, ArgvPlan)
        argv = list(plan.argv)
        if resume is not None and self.resume_args:
            self.step_states.set_aside_after(resume.step, run_dir, attempt)
            argv = _without_flag(argv, self.resume_args[0]) + [
                a.replace("{state}", resume.dir).replace("{step}", str(resume.step)) for a in self.resume_args]
        elif attempt > 1 and self.resume_args:
            self.step_states.set_aside_after(0, run_dir, attempt)  # partial states of earlier attempts
        return Launch.of(plan, argv, resume)


    def doctor(self, env: Mapping[str, str]) -> list[Finding]:
        how = "resumes from the newest complete state" if self.resume_args else "has no resume: restarts unchanged"
        return [Finding("info", "trainer", f"the project's trainer: section describes this command: trainsup "
                        f"{how}; its flags and files are not checked")]


def _without_flag(argv: list[str], flag: str) -> list[str]:
    """The command without ``flag`` and the values after it (the resume arguments replace it)."""
    if not flag.startswith("-"):
        return argv
    out: list[str] = []
    skipping = False
    for token in argv:
        if token == flag or token.startswith(flag + "="):
            skipping = token == flag
            continue
        if skipping and not token.startswith("-"):
            continue
        skipping = False
        out.append(token)
    return out


def _open(setup: Setup) -> TrainerRun:
    if setup.section is None:
        raise UsageError("trainer: declarative needs a trainer: section in the project file")
    return DeclarativeRun(setup)


# Chosen only by a project's trainer: mapping (it claims no command); its lines are the project's.
FAMILY = Family("declarative",
                "any command plus a project's trainer: section (states, complete marker, resume, lines)",
                claim=lambda argv: NO_CLAIM, session=_open)
