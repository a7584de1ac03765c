"""Owns the run's live control: the policy (or project) file edited mid-run, and handing every other
watched file to the trainer's inputs.

A bad policy edit is rejected with its line and the run keeps its policy; a good one applies at
once. In a project file, an edited ``command:``, ``cwd:`` or ``env:`` changes what runs: it is
scheduled for the next complete state, where a new supervisor starts on the edited file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from ..record import journalkinds as kinds
from ..record.journal import Journal
from ..record.textfmt import shown_path
from ..sensors.watch import FileWatcher
from ..trainers.base import Plan, TrainerRun
from ..trainers.edits import EditLog
from .policy import Policy, PolicyError, load_policy
from .project import Project, ProjectError, load_project

Action = Literal["none", "at_checkpoint", "now", "policy", "command"]
_LINE = re.compile(r":(\d+): ")


class LiveControl:
    def __init__(self, trainer: TrainerRun, policy: Policy, policy_path: Path | None, journal: Journal,
                 say: Callable[[str], None], project: Project | None = None) -> None:
        self.trainer, self.journal, self.say = trainer, journal, say
        self.policy, self.policy_path = policy, policy_path
        self.project = project  # the policy file is this project's file: it says what to run, too
        self.project_next: Project | None = None  # an edited command, for the next checkpoint
        self.edits = EditLog(journal, say)
        self.attempt = 0

    def watch(self, watcher: FileWatcher) -> None:
        self.trainer.inputs.watch(watcher)
        if self.policy_path is not None:
            watcher.watch_file(self.policy_path)

    def before_launch(self, attempt: int) -> None:
        self.attempt = attempt
        self.edits.launched(attempt)

    def on_change(self, path: Path, kind: str, plan: Plan) -> Action:
        self.journal.event(kinds.FILE_CHANGED, path=str(path), kind=kind)
        if path != self.policy_path:
            return self.trainer.inputs.on_change(path, kind, plan)
        if kind == "deleted":
            self.edits.deleted(path)
            return "none"
        self.edits.present(path)
        return self._policy_changed(path)

    def _policy_changed(self, path: Path) -> Action:
        try:
            project = load_project(path) if self.project is not None else None
            self.policy = project.policy if project is not None else load_policy(path)
        except (PolicyError, ProjectError) as exc:
            m = _LINE.search(str(exc))
            return self.edits.reject(path, str(exc), int(m.group(1)) if m else None)
        self.edits.applied_now(path, self.attempt)
        self.trainer.inputs.settings_changed(self.policy.trainer_settings())
        if project is None or self.project is None:
            return "policy"
        changed = [k for k in ("command", "cwd", "env", "trainer") if getattr(project, k) != getattr(self.project, k)]
        if not changed:
            return "policy"
        # What runs changes: from the next complete state, by a supervisor started on the new file.
        self.project_next = project
        self.edits.schedule(path, "at_checkpoint")
        self.say(f"{shown_path(path)} changed ({', '.join(changed)}): the run restarts on it from the next "
                 "checkpoint")
        return "command"
