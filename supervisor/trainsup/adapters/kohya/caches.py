"""Owns the trainer's cache files next to the images: which are stale, and setting them aside.

kohya's cache validity checks look only for keys: an edited caption leaves a stale text-encoder
cache (``{stem}_te_outputs.npz``, ``{stem}_flux_te.npz``, ``{stem}_sd3_te.npz``) and a changed
resolution or bucketing leaves stale latents (``{stem}_{W}x{H}_{arch}.npz``, legacy ``{stem}.npz``).
A manifest in the run dir remembers the caption hash behind each TE cache and the latent settings;
at a launch, exactly the stale files move to ``RUN_DIR/invalidated/<timestamp>/`` under their path
relative to the dataset root, so the trainer rebuilds them. Images, captions and every other file
are never touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...record.fsutil import atomic_write_text

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
TE_CACHE_SUFFIXES = ("_te_outputs.npz", "_flux_te.npz", "_sd3_te.npz")
_LATENT = re.compile(r"^(?P<stem>.+)_\d{4}x\d{4}_(?:sd|sdxl|sd3|flux)\.npz$")
LATENT_KEYS = ("resolution", "enable_bucket", "min_bucket_reso", "max_bucket_reso", "bucket_reso_steps",
               "bucket_no_upscale")


KOHYA_CAPTION_EXTENSIONS = (".caption", ".txt")  # kohya's default first; .txt is the common choice


@dataclass(frozen=True)
class Subset:
    root: Path  # the dataset root the subset belongs to (paths in invalidated/ are relative to it)
    image_dir: Path
    caption_extension: str | None = None  # None: not given, so either of KOHYA_CAPTION_EXTENSIONS

    @property
    def caption_extensions(self) -> tuple[str, ...]:
        return (self.caption_extension,) if self.caption_extension else KOHYA_CAPTION_EXTENSIONS

    def caption_for(self, stem: str) -> Path:
        candidates = [self.image_dir / f"{stem}{ext}" for ext in self.caption_extensions]
        return next((c for c in candidates if c.exists()), candidates[0])


@dataclass
class CacheManifest:
    path: Path
    te: dict[str, str] = field(default_factory=dict)  # cache file -> caption hash it was built from
    captions: dict[str, str] = field(default_factory=dict)  # caption file -> hash at the last launch
    latent_settings: dict[str, object] | None = None
    last_launch: float = 0.0

    @classmethod
    def load(cls, path: Path) -> CacheManifest:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls(path)
        return cls(path, dict(data.get("te", {})), dict(data.get("captions", {})),
                   data.get("latent_settings"), float(data.get("last_launch", 0.0)))

    def save(self) -> None:
        data = {"te": self.te, "captions": self.captions, "latent_settings": self.latent_settings,
                "last_launch": self.last_launch}
        try:
            atomic_write_text(self.path, json.dumps(data, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass  # a lost manifest only means less invalidation next time, never a lost file


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def te_cache_files(subset: Subset) -> list[tuple[Path, Path]]:
    """(cache file, caption file) pairs present in a subset."""
    pairs = []
    try:
        entries = sorted(subset.image_dir.iterdir())
    except OSError:
        return []
    for entry in entries:
        for suffix in TE_CACHE_SUFFIXES:
            if entry.name.endswith(suffix):
                stem = entry.name[: -len(suffix)]
                pairs.append((entry, subset.caption_for(stem)))
    return pairs


def latent_cache_files(subset: Subset) -> list[Path]:
    found = []
    try:
        entries = sorted(subset.image_dir.iterdir())
    except OSError:
        return []
    images = {e.stem for e in entries if e.suffix.lower() in IMAGE_SUFFIXES}
    for entry in entries:
        m = _LATENT.match(entry.name)
        if (m and m.group("stem") in images) or (entry.suffix == ".npz" and entry.stem in images):
            found.append(entry)
    return found


def caption_files(subset: Subset) -> list[Path]:
    try:
        return sorted(p for p in subset.image_dir.iterdir() if p.name.endswith(subset.caption_extensions))
    except OSError:
        return []


def stale_caches(subsets: list[Subset], manifest: CacheManifest, latent_settings: dict[str, object],
                 now: float) -> list[tuple[Path, Subset]]:
    """Decide which cache files are stale, and bring the manifest up to date for the rest."""
    stale: list[tuple[Path, Subset]] = []
    seen_te: set[str] = set()
    for subset in subsets:
        for cache, caption in te_cache_files(subset):
            current = _digest(caption)
            key = str(cache)
            built_from = manifest.te.get(key)
            if built_from is None:
                # Built during the last attempt: from the caption as it was at that launch. Older
                # than trainsup's first look: nothing to compare with, so take it as current.
                try:
                    fresh = cache.stat().st_mtime >= manifest.last_launch > 0
                except OSError:
                    continue
                built_from = manifest.captions.get(str(caption)) if fresh else current
            if built_from is not None and current is not None and built_from != current:
                stale.append((cache, subset))
                manifest.te.pop(key, None)
            else:
                manifest.te[key] = built_from or ""
                seen_te.add(key)
    if manifest.latent_settings is not None and manifest.latent_settings != latent_settings:
        for subset in subsets:
            stale.extend((f, subset) for f in latent_cache_files(subset))
    manifest.te = {k: v for k, v in manifest.te.items() if k in seen_te}
    manifest.latent_settings = latent_settings
    manifest.captions = {str(c): d for s in subsets for c in caption_files(s) if (d := _digest(c))}
    manifest.last_launch = now
    return stale


def set_aside(stale: list[tuple[Path, Subset]], run_dir: Path) -> list[str]:
    """Move stale cache files into ``RUN_DIR/invalidated/<timestamp>/`` keeping relative paths."""
    if not stale:
        return []
    target = run_dir / "invalidated" / time.strftime("%Y%m%d-%H%M%S")
    moved = []
    for path, subset in stale:
        rel = path.relative_to(subset.root) if path.is_relative_to(subset.root) else Path(path.name)
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, dest)
        except OSError:
            import shutil

            shutil.move(str(path), str(dest))  # another file system: copy then remove the cache
        moved.append(str(path))
    return moved
