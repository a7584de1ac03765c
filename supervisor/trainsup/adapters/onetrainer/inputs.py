"""Owns OneTrainer's watched inputs: the config (``--config-path``) and the concept and sample files
it names, edited while the run goes on.

OneTrainer reads all three once at start (the sample file even with sampling off: a broken one
stops the run at start). So every attempt runs on frozen copies in ``RUN_DIR/attempt-N/`` (the
derived config names the copied concept and sample files), and an edit reaches the trainer only
through here: it is validated first (a file that is not a JSON object or list is rejected with its
line, and the run keeps what it has), then scheduled for the next backup, where the engine stops
the trainer (SIGINT: OneTrainer backs up first) and resumes it with a fresh derived config. A config
edit of a key the backup fixes (``lora_rank``, ``lora_alpha``, ``model_type``) is rejected: a resume
cannot change it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...record.fsutil import atomic_write_bytes
from ...record.journal import Journal
from ...record.textfmt import shown_path
from ...sensors.watch import FileWatcher
from ...trainers.base import EditAction, Inputs, Plan
from ...trainers.edits import EditLog
from .plan import OTPlan, get_dotted

BACKUP_FIXED = ("lora_rank", "lora_alpha", "model_type")
FILE_KEYS = {"concept_file_name": "concepts.json", "sample_definition_file_name": "samples.json"}


def parse_json(raw: bytes, path: Path) -> tuple[Any, str, int | None]:
    """(document, problem, line): problem '' when ``raw`` is a JSON object or list."""
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg})", exc.lineno
    except ValueError as exc:
        return None, f"not valid JSON ({exc})", None
    if not isinstance(doc, (dict, list)):
        return None, f"expected a JSON object or list, got {type(doc).__name__}", None
    return doc, "", None


class OTInputs(Inputs):
    def __init__(self, plan: OTPlan, run_dir: Path, journal: Journal, say: Callable[[str], None]) -> None:
        self.plan, self.run_dir, self.say = plan, run_dir, say
        self.edits = EditLog(journal, say)
        self.config = plan.config_path
        self.files: dict[str, Path] = {}  # config key -> the user's file
        self.accepted: dict[Path, bytes] = {}  # the content each attempt's copy gets
        for key in FILE_KEYS:
            path = plan.path(key)
            if path is None:
                continue
            self.files[key] = path
            try:
                raw = path.read_bytes()
            except OSError:
                continue  # OneTrainer reports it at start; doctor names it
            if not parse_json(raw, path)[1]:
                self.accepted[path] = raw

    def watched(self) -> list[Path]:
        return [self.config, *self.files.values()]

    def watch(self, watcher: FileWatcher) -> None:
        for path in self.watched():
            watcher.watch_file(path)

    def owns(self, path: Path) -> bool:
        return path in self.watched()

    # --- launching -------------------------------------------------------------------------------
    def snapshot(self, attempt: int) -> dict[str, str]:
        """Write this attempt's copies of the concept and sample files; the config keys to point at them."""
        extra: dict[str, str] = {}
        for key, path in self.files.items():
            raw = self.accepted.get(path)
            if raw is None:
                continue
            copy = self.run_dir / f"attempt-{attempt}" / FILE_KEYS[key]
            copy.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(copy, raw)
            extra[key] = str(copy)
        return extra

    def launched(self, attempt: int) -> None:
        self.edits.launched(attempt)

    # --- edits -----------------------------------------------------------------------------------
    def on_change(self, path: Path, kind: str, plan: Plan | None = None) -> EditAction:
        if kind == "deleted":
            self.edits.deleted(path)
            return "none"
        self.edits.present(path)
        try:
            raw = path.read_bytes()  # read once: the bytes validated are the bytes used
        except OSError as exc:
            return self.edits.reject(path, f"cannot read it ({exc.strerror or exc})", None)
        doc, problem, line = parse_json(raw, path)
        if problem:
            return self.edits.reject(path, problem, line)
        if path == self.config:
            if not isinstance(doc, dict):
                return self.edits.reject(path, "expected a JSON object", None)
            changed = _changed(self.plan.doc, doc)
            if not changed:
                return "none"
            fixed = [k for k in changed if k in BACKUP_FIXED]
            if fixed:
                return self.edits.reject(path, "cannot change under a resume (the backup fixes it): "
                                         + ", ".join(fixed), None)
            self.plan.doc = doc
            if isinstance(plan, OTPlan):
                plan.doc = doc  # the plan remedies read and the next launch gets
            what = ", ".join(changed)
        else:
            if self.accepted.get(path) == raw:
                return "none"
            self.accepted[path] = raw
            what = "content"
        self.edits.schedule(path, "at_checkpoint")
        self.say(f"{shown_path(path)} changed ({what}): applied from the next backup")
        return "at_checkpoint"


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [k for k in keys if get_dotted(old, k) != get_dotted(new, k)]
