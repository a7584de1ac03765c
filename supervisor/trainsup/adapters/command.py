"""Owns the ``command`` adapter: any command, supervised with no trainer knowledge at all.

What needs no knowledge of the trainer still works: restarts on a crash with backoff and budget,
hang detection on silence (every line the command prints shows it alive), GPU reclaim, the journal,
``status``, notifications and metrics. Every attempt relaunches the same command unchanged (a
trainer that resumes by itself, like ``--resume_from_checkpoint latest``, then resumes); only an
environment variable can be set by a remedy, and every other rung is skipped (the journal says so).
Success is exit 0. It scores lowest, so any adapter that knows the command wins over it. ``trainsup
doctor`` says in one information line that nothing trainer-specific is checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from ..faults import remedies
from ..faults.remedies import Action, Rung
from ..faults.verdict import NOTHING_SAID, Said
from ..record.journal import Journal
from ..record.ledger import Ledger, StateRecord
from ..trainers.base import (
    ANY_COMMAND,
    NO_CLAIM,
    ArgvPlan,
    Family,
    Finding,
    Launch,
    Plan,
    Say,
    Setup,
    TrainerRun,
    apply_env,
    restart_with_same_settings,
)
from ..trainers.interpreter import trainer_python

NOTE = ("no adapter knows this command: trainsup restarts it unchanged after a crash (it resumes only "
        "if the command resumes by itself) and detects hangs on silence; a project's `trainer:` section "
        "can describe its states")
DOCTOR = ("no adapter knows this command: trainsup supervises it without trainer knowledge (restarts after a "
          "crash, hangs on silence, GPU reclaim); its flags and files are not checked")


# Flags that name where a command writes, in the spellings trainers use: the run dir goes beside them.
OUTPUT_FLAGS = ("--output_dir", "--output-dir", "--out_dir", "--out-dir", "--out")


def output_dir_of(argv: Sequence[str], cwd: Path) -> Path | None:
    """The directory the command's own output flag names (its last value), relative to ``cwd``."""
    found: str | None = None
    for i, token in enumerate(argv):
        name, eq, value = token.partition("=")
        if name in OUTPUT_FLAGS:
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    if not found:
        return None
    path = Path(found).expanduser()
    return path if path.is_absolute() else cwd / path


class CommandRun(TrainerRun):
    family = "command"

    def __init__(self, setup: Setup) -> None:
        super().__init__()
        self.plan = ArgvPlan(list(setup.argv))
        self.output_dir = output_dir_of(setup.argv, setup.cwd)
        self.notes = [NOTE]

    def bind(self, run_dir: Path, ledger: Ledger, journal: Journal, say: Say) -> None:
        return None  # its states are the default's: none known

    def launch(self, plan: Plan, attempt: int, resume: StateRecord | None, run_dir: Path) -> Launch:
        assert isinstance(plan, ArgvPlan)
        return Launch.of(plan, plan.argv)  # never a resume of trainsup's: the command as given

    def ladder(self, fault: str, plan: Plan | None = None) -> tuple[Rung, ...]:
        return remedies.ladder(fault)

    def apply(self, plan: Plan, action: Action, evidence: Said = NOTHING_SAID) -> str | None:
        if action.kind == "set_env":
            return apply_env(plan, action)
        return restart_with_same_settings(action)

    def command_line(self, plan: Plan) -> list[str]:
        assert isinstance(plan, ArgvPlan)
        return list(plan.argv)

    def python(self, env: Mapping[str, str]) -> str | None:
        assert isinstance(self.plan, ArgvPlan)
        return trainer_python(self.plan.argv, dict(env))

    def doctor(self, env: Mapping[str, str]) -> list[Finding]:
        return [Finding("info", "trainer", DOCTOR)]


# Its output means nothing to trainsup, and the built-in table is its wording.
FAMILY = Family("command", "any command: restarts, hangs on silence, GPU reclaim; no states, no flag remedies",
                claim=lambda argv: ANY_COMMAND if argv else NO_CLAIM, session=CommandRun)
