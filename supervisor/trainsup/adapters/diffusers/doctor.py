"""Owns the diffusers scripts' preflight checks (``trainsup doctor``): the command and its output
dir, read only, never running the script.

What the real bed showed each to do: any entry of ``--output_dir`` whose name starts with
``checkpoint`` but is not ``checkpoint-<number>`` (``checkpoint-10.bad``) crashes ``latest`` (and every
save under ``--checkpoints_total_limit``) with ``invalid literal for int()``; a checkpoint named to
``--resume_from_checkpoint`` is looked for under ``--output_dir`` only, by its last component, and a
missing one ends the run at start-up; ``--checkpoints_total_limit`` deletes before it saves.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...trainers.base import Finding
from ...trainers.cmdline import TrainerCommand
from .states import STATE_NAME


def check(cmd: TrainerCommand, out: Path, total: int | None, resume: str | None) -> list[Finding]:
    found = [Finding("info", "resume", "trainsup resumes with --resume_from_checkpoint checkpoint-N, the newest "
                     "complete checkpoint (the script's own `latest` takes the newest folder unchecked), "
                     "preferring an epoch's end: only there does the script resume with the same data order")]
    found += _odd_names(out)
    found += _cadence(cmd, total)
    limit = _int(cmd.get("checkpoints_total_limit"))
    if limit is not None and limit <= 1:
        found.append(Finding("warning", "checkpoints_total_limit", f"--checkpoints_total_limit {limit}: the script "
                             "deletes the old checkpoint before it writes the new one, so a fault inside that save "
                             "leaves no checkpoint to resume from; trainsup run raises it to 2",
                             "--checkpoints_total_limit 2"))
    if resume not in (None, "latest"):
        named = out / Path(resume).name
        if not named.is_dir():
            found.append(Finding("blocker", "resume_missing", f"--resume_from_checkpoint {resume}: the script "
                                 f"looks for {named} (the last component, under --output_dir), which does not exist",
                                 "name a checkpoint-N folder of --output_dir, or `latest`"))
    return found


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _odd_names(out: Path) -> list[Finding]:
    try:
        names = sorted(os.listdir(out))
    except OSError:
        return []
    odd = [n for n in names if n.startswith("checkpoint") and not STATE_NAME.fullmatch(n)]
    if not odd:
        return []
    return [Finding("blocker", "checkpoint_name", f"{out / odd[0]}: the script's `latest` (and every save under "
                    "--checkpoints_total_limit) reads every name starting with `checkpoint` as checkpoint-<number> "
                    "and crashes on this one", f"rename it to a name that does not start with `checkpoint` "
                    f"(e.g. old-{odd[0]})")]


def _cadence(cmd: TrainerCommand, total: int | None) -> list[Finding]:
    every = _int(cmd.get("checkpointing_steps"))
    if total is None or total < 2 or (every or 500) < total:
        return []
    return [Finding("warning", "no_checkpoint", f"--checkpointing_steps {every or '500 (the default)'} saves no "
                    f"checkpoint in a {total}-step run: a fault would restart it from the beginning; trainsup run "
                    "sets a cadence of about a tenth of the run", f"--checkpointing_steps {max(1, total // 10)}")]
