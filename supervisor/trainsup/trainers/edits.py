"""Owns the journal's side of edited inputs, shared by the engine's live control and every adapter's
inputs: a rejected edit (with its line), an edit scheduled for a later launch, and the scheduled
edits that a launch applies (``change_rejected`` / ``change_scheduled`` / ``change_applied``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..record.journal import Journal
from ..record.textfmt import shown_path


@dataclass
class EditLog:
    journal: Journal
    say: Callable[[str], None]
    pending: list[Path] = field(default_factory=list)
    deleted_warned: set[Path] = field(default_factory=set)

    def reject(self, path: Path, reason: str, line: int | None) -> Literal["none"]:
        self.journal.event("change_rejected", path=str(path), reason=reason, line=line)
        where = f"{shown_path(path)}:{line}" if line else shown_path(path)
        self.say(f"your edit of {where} is not applied: {reason}; the run continues unchanged")
        return "none"

    def schedule(self, path: Path, apply: str) -> None:
        if path not in self.pending:
            self.pending.append(path)
        self.journal.event("change_scheduled", path=str(path), apply=apply)

    def applied_now(self, path: Path, attempt: int) -> None:
        self.journal.event("change_applied", path=str(path), attempt=attempt)

    def launched(self, attempt: int) -> None:
        """A launch took every scheduled edit."""
        for path in self.pending:
            self.applied_now(path, attempt)
        self.pending = []

    def deleted(self, path: Path) -> None:
        """A watched file was deleted: warn once (the run keeps its snapshot)."""
        if path not in self.deleted_warned:
            self.deleted_warned.add(path)
            self.say(f"warning: {shown_path(path)} was deleted; the run keeps its snapshot")

    def present(self, path: Path) -> None:
        self.deleted_warned.discard(path)
