"""Owns a run's identity: what makes a run *this* run, written once in ``RUN_DIR/identity.json``,
and finding, among the run dirs beside an output dir, the one that holds this run.

A trainer adapter says what shapes its weights (``TrainerRun.identity``: the script, the base model,
the dataset's files, the network and optimizer settings, the seed, the output name); this module
only compares those fields. A state is a resume point only for a run of the same identity, so a
different run started where another run's records lie gets a run dir of its own
(``.trainsup-NAME`` beside ``.trainsup``), starts fresh, and leaves every file of the other run as
it was. Remedies change the launch plan, never the identity: the fields are read from the user's
command at the first start.

Run dirs written before identities existed have no ``identity.json``: such a run is this run when
its first ``run_start`` names the same command.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fsutil import atomic_write_text
from .journal import read_events
from .journalkinds import ENDS, FINISHED, RUN_START

IDENTITY_FILE = "identity.json"
# What a run dir holds once a run was started in it (a lock alone is a start that never got going).
RECORDS = (IDENTITY_FILE, "events.jsonl", "ledger.json")
MEDIA = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".avif", ".jxl", ".tif", ".tiff",
                   ".mp4", ".webm", ".mov", ".mkv", ".avi"})
MAX_LISTED = 200_000  # a dataset summary stops counting here: cheap even on a huge folder


class IdentityError(ValueError):
    """The run dir cannot be this run's (a usage error, exit 2)."""


@dataclass(frozen=True)
class Identity:
    """The fields that make a run this run (JSON values, compared by value)."""

    fields: Mapping[str, Any]

    def digest(self) -> str:
        text = json.dumps(self.fields, sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def differences(self, other: Identity) -> list[str]:
        """What differs, as ``key: theirs -> ours`` (the other run's value first)."""
        out = []
        for key in sorted(set(self.fields) | set(other.fields)):
            ours, theirs = self.fields.get(key), other.fields.get(key)
            if ours != theirs:
                out.append(f"{key}: {_short(theirs)} -> {_short(ours)}")
        return out


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def files_summary(paths: Iterable[Path]) -> dict[str, Any]:
    """A cheap summary of a dataset's files: how many media files (images, videos) each folder holds
    and a hash of their names. Captions, caches and configs are left out on purpose: a caption edited
    mid-run is a live edit, and the trainer's own caches appear while it trains."""
    summary: dict[str, Any] = {}
    for path in paths:
        key = str(path)
        if path.is_file():
            summary[key] = {"file": path.name}
            continue
        names: list[str] = []
        try:
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in files:
                    if Path(name).suffix.lower() in MEDIA:
                        names.append(os.path.relpath(os.path.join(root, name), path))
                if len(names) >= MAX_LISTED:
                    break
        except OSError:
            pass
        digest = hashlib.sha256("\n".join(sorted(names)).encode("utf-8")).hexdigest()[:16]
        summary[key] = {"media_files": len(names), "names": digest} if path.is_dir() else {"missing": True}
    return summary


@dataclass(frozen=True)
class PastRun:
    """What a run dir tells of the run recorded in it."""

    run_dir: Path
    identity: Identity | None  # None: written before identities existed (``argv`` decides)
    argv: tuple[str, ...] | None  # the command of its first start
    created: float
    ended: str | None = None  # "finished" or "gave_up" when its last supervisor ended it; None otherwise
    ended_at: float | None = None
    final_weights: str | None = None

    def same_run(self, identity: Identity, argv: tuple[str, ...]) -> bool:
        if self.identity is not None:
            return self.identity.digest() == identity.digest()
        # Written before identities: the command of its first start decides; a journal that never
        # recorded one (cut, or hand-made) cannot tell, and is taken as this run's, as it always was.
        return self.argv is None or self.argv == argv


def has_records(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in RECORDS)


def read_past(run_dir: Path) -> PastRun | None:
    """The run recorded in ``run_dir``, or None when it holds no run's records."""
    if not has_records(run_dir):
        return None
    identity, created = None, 0.0
    try:
        data = json.loads((run_dir / IDENTITY_FILE).read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("fields"), dict):
            identity = Identity(data["fields"])
            created = float(data.get("created") or 0.0)
    except (OSError, ValueError, TypeError):
        pass
    argv: tuple[str, ...] | None = None
    ended = ended_at = final = None
    for record in read_events(run_dir):
        kind = record.get("event")
        if kind == RUN_START:
            if argv is None and isinstance(record.get("argv"), list):
                argv = tuple(str(a) for a in record["argv"])
                created = created or float(record.get("ts") or 0.0)
            ended = ended_at = final = None  # a supervisor started after the last end: not ended
        elif kind in ENDS:
            ended, ended_at = str(kind), float(record.get("ts") or 0.0)
            final = record.get("final_weights") if kind == FINISHED else None
    if not created:
        try:
            created = run_dir.stat().st_mtime
        except OSError:
            created = 0.0
    return PastRun(run_dir, identity, argv, created, ended, ended_at, final)


def write_identity(run_dir: Path, identity: Identity, label: str | None, *, replaced: bool = False) -> None:
    """Record this run's identity (once; again only when the user edited the running command)."""
    path = run_dir / IDENTITY_FILE
    created = time.time()
    if path.exists():
        if not replaced:
            return
        past = read_past(run_dir)
        created = past.created if past is not None and past.created else created
    record = {"digest": identity.digest(), "label": label, "created": round(created, 3),
              "fields": dict(identity.fields)}
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


@dataclass(frozen=True)
class Choice:
    """Where this run's records go, and what was found there."""

    run_dir: Path
    past: PastRun | None  # this same run's earlier record: continue it
    others: tuple[PastRun, ...] = field(default=())  # other runs' records beside it, left as they are

    def note(self, identity: Identity) -> str | None:
        """One line for a run that starts fresh where another run's records lie."""
        if self.past is not None or not self.others:
            return None
        other = self.others[0]
        what = "; ".join(other.identity and identity.differences(other.identity)[:4] or ["another command"])
        return (f"{other.run_dir} holds another run ({what}): this run starts fresh in {self.run_dir}; "
                f"the other run's files are left as they were")


def candidates(base: Path) -> list[Path]:
    """``base`` and its generations beside it (``.trainsup``, ``.trainsup-NAME``, ``.trainsup-NAME-2``)."""
    found = [base]
    try:
        found += sorted(p for p in base.parent.glob(f"{base.name}-*") if p.is_dir())
    except OSError:
        pass
    return found


def find_same(base: Path, identity: Identity, argv: tuple[str, ...], beside: bool = True) -> PastRun | None:
    """The newest earlier record of this run among ``base`` (and its generations, with ``beside``)."""
    same = [p for p in (read_past(d) for d in (candidates(base) if beside else [base]))
            if p is not None and p.same_run(identity, argv)]
    return max(same, key=lambda p: p.created) if same else None


def choose(base: Path, identity: Identity, argv: tuple[str, ...], label: str | None, *,
           explicit: bool, fresh: bool) -> Choice:
    """The run dir of this run: its own earlier one (unless ``fresh``), else a free one.

    ``explicit``: the user named the run dir, so no other is chosen: one holding another run's
    records (or this run's, with ``fresh``) is refused with what to do.
    """
    dirs = [base] if explicit else candidates(base)
    pasts = [p for p in (read_past(d) for d in dirs) if p is not None]
    same = [p for p in pasts if p.same_run(identity, argv)]
    others = tuple(p for p in pasts if not p.same_run(identity, argv))
    if same and not fresh:
        return Choice(max(same, key=lambda p: p.created).run_dir, max(same, key=lambda p: p.created), others)
    base_past = next((p for p in pasts if p.run_dir == base), None)
    if base_past is None:
        return Choice(base, None, others)
    if explicit:
        if fresh:
            raise IdentityError(f"--fresh: {base} holds this run's records; name another --run-dir for the "
                                "new run (nothing there is touched)")
        what = "; ".join(base_past.identity and identity.differences(base_past.identity)[:4]
                         or ["another command"])
        raise IdentityError(f"{base} holds another run's records ({what}); a run dir is one run's: name "
                            "another --run-dir (or run: in the project file) for this one")
    stem = f"{base.name}-{_slug(label)}"
    taken = {d.name for d in candidates(base) if d.exists()}
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}"
    return Choice(base.parent / name, None, others)


def _slug(label: str | None) -> str:
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", label or "run").strip("-.")
    return text[:60] or "run"
