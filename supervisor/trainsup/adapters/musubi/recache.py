"""Owns making musubi-tuner's latent caches again, in the run dir, when what they are made from changed
after the user cached them: the memory remedy that lowers the resolution (``lower_resolution``), or an
accepted edit of a key only the latent caching reads (``caches.LATENT_BOUND``: resolution, bucketing,
frames).

musubi trains only from caches its separate caching scripts wrote before the run (see ``caches``), so
such a change is carried out the way musubi's own workflow does it, out of the user's files: the
launch's derived dataset TOML points each dataset's ``cache_directory`` into
``RUN_DIR/caches/<key>/dataset-N`` (the key is a digest of the latent settings: a later launch with the
same settings finds its caches made), the user's text-encoder caches are copied there (a resolution
changes nothing the text encoder made of a caption), and the engine runs musubi's latent-caching script
on that TOML before the trainer (``Launch.before``), unless every item's latent cache there is complete.
The user's cache directory is only read: musubi's caching script deletes the cache files it does not
expect in the directory it writes, and that directory is the run dir's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from ...record.fsutil import atomic_write_text
from ...record.textfmt import shown_path
from ...trainers.base import PreStep
from ...trainers.cmdline import TrainerCommand
from ...trainers.sthead import HeaderError, load_header
from . import caches

MIN_SIDE = 256  # the remedy lowers no side below this: smaller pictures would train another model
STEP = 16  # musubi's bucket step: a side is a multiple of it


def _scaled(value: object, scale: float) -> object:
    """A ``resolution`` value (one side, or ``[width, height]``) times ``scale``, each side rounded down
    to musubi's bucket step; anything else unchanged."""
    def side(v: int) -> int:
        return max(STEP, int(v * scale) // STEP * STEP)

    if isinstance(value, int) and not isinstance(value, bool):
        return side(value)
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return [side(v) for v in value]
    return value


def scaled(doc: dict[str, Any], scale: float) -> dict[str, Any]:
    """A copy of a dataset TOML's values with every ``resolution`` (``[general]``'s and each
    ``[[datasets]]``'s) times ``scale``."""
    out = copy.deepcopy(dict(doc))
    if scale == 1:
        return out
    tables = [out.get("general"), *(out.get("datasets") or [])]
    for table in tables:
        if isinstance(table, dict) and "resolution" in table:
            table["resolution"] = _scaled(table["resolution"], scale)
    return out


def resolutions(doc: dict[str, Any]) -> list[object]:
    """Each dataset's resolution as musubi merges ``[general]`` under it."""
    general = doc.get("general") if isinstance(doc.get("general"), dict) else {}
    assert isinstance(general, dict)
    tables = doc.get("datasets")
    return [{**general, **t}.get("resolution") for t in (tables if isinstance(tables, list) else [])
            if isinstance(t, dict)]


def smallest_side(doc: dict[str, Any]) -> int | None:
    sides = [v for r in resolutions(doc) for v in (r if isinstance(r, list) else [r])
             if isinstance(v, int) and not isinstance(v, bool)]
    return min(sides) if sides else None


def _latent_settings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    general = doc.get("general") if isinstance(doc.get("general"), dict) else {}
    assert isinstance(general, dict)
    tables = doc.get("datasets")
    return [{k: {**general, **t}.get(k) for k in (*caches.LATENT_BOUND, "image_directory", "video_directory",
                                                  "image_jsonl_file", "video_jsonl_file")}
            for t in (tables if isinstance(tables, list) else []) if isinstance(t, dict)]


def _complete(cache: Path) -> bool:
    try:
        return load_header(cache).missing_bytes() == 0
    except (HeaderError, OSError):
        return False


@dataclass(frozen=True)
class Recached:
    """A launch's caches in the run dir: the dataset TOML to write, and the caching to run first."""

    doc: dict[str, Any]
    root: Path  # RUN_DIR/caches/<key>
    step: PreStep | None  # None: every item's latent cache there is complete already


def plan(cached_from: dict[str, Any], launch_doc: dict[str, Any], command: TrainerCommand, cwd: Path,
         run_dir: Path, dataset_config: Path) -> Recached | None:
    """What this launch needs when its dataset TOML (``launch_doc``, the remedy's resolution applied)
    differs from the one the user's caches were made from (``cached_from``) only in latent settings;
    None when nothing of that changed, or when something else did (the caller's checks keep those out:
    a caption setting needs the text encoder)."""
    bound = caches.cache_bound_changes(cached_from, launch_doc)
    caching = caches.caching_for(command.script)
    if not bound or caching is None or any(b not in caches.LATENT_BOUND for b in bound):
        return None
    key = hashlib.sha256(json.dumps(_latent_settings(launch_doc), sort_keys=True, default=str).encode())
    root = run_dir / "caches" / key.hexdigest()[:12]
    doc = copy.deepcopy(launch_doc)
    tables = [t for t in doc.get("datasets") or [] if isinstance(t, dict)]
    users = caches.datasets(cached_from, cwd)
    made = True
    for i, (table, new) in enumerate(zip(tables, caches.datasets(doc, cwd))):
        where = root / f"dataset-{i}"
        where.mkdir(parents=True, exist_ok=True)
        table["cache_directory"] = str(where)
        mine = users[i].cache_dir if i < len(users) else None
        for arch in caching.architectures:
            for te in sorted(mine.glob(f"*_{arch}_te.safetensors")) if mine is not None and mine.is_dir() else ():
                target = where / te.name
                if not target.exists() or target.stat().st_size != te.stat().st_size:
                    shutil.copy2(te, target)  # a copy: the user's cache stays the user's alone
        report = caches.inspect(caches.Dataset(i, where, new.media_dir, new.video, new.caption_extension),
                                caching.architectures)
        if new.media_dir is None or report.uncached or not report.latents or not all(
                _complete(c) for found in report.latents.values() for c in found):
            made = False
    argv = caches.caching_argv(command, str(dataset_config))
    assert argv is not None  # caching is known
    sizes = ", ".join(sorted({_shown(r) for r in resolutions(doc)}))
    step = None if made else PreStep(tuple(argv[0]), f"caching the latents again ({', '.join(bound)}: {sizes}) "
                                                     f"into {shown_path(root)} with {caching.latents}.py")
    return Recached(doc, root, step)


def _shown(resolution: object) -> str:
    if isinstance(resolution, list):
        return "x".join(str(v) for v in resolution)
    return f"{resolution}x{resolution}" if isinstance(resolution, int) else str(resolution)


def write(recached: Recached, dataset_config: Path, source: Path) -> None:
    """The launch's derived dataset TOML, pointing at the run dir's caches (its values only: the user's
    comments stay in the user's file)."""
    atomic_write_text(dataset_config, f"# derived by trainsup from {source}; caches made again in "
                                      f"{recached.root}\n" + tomlkit.dumps(recached.doc))
