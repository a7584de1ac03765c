"""Owns the trainer's cache files next to the images: which are stale, and setting them aside.

kohya's cache validity checks look only for keys and shapes: an edited caption leaves a stale text-encoder
cache (``{stem}_te_outputs.npz``, ``{stem}_flux_te.npz``, ``{stem}_sd3_te.npz``), and an edited image or a
changed resolution or bucketing leaves stale latents (``{stem}_{W}x{H}_{arch}.npz``, legacy ``{stem}.npz``).
A manifest in the run dir remembers the caption hash behind each TE cache, the image's size and mtime
behind each latent cache (images are too big to hash at every launch) and the latent settings;
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
    latents: dict[str, str] = field(default_factory=dict)  # latent cache file -> image stamp it was built from
    images: dict[str, str] = field(default_factory=dict)  # image file -> stamp at the last launch

    @classmethod
    def load(cls, path: Path) -> CacheManifest:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls(path)
        return cls(path, dict(data.get("te", {})), dict(data.get("captions", {})),
                   data.get("latent_settings"), float(data.get("last_launch", 0.0)),
                   dict(data.get("latents", {})), dict(data.get("images", {})))

    def save(self) -> None:
        data = {"te": self.te, "captions": self.captions, "latent_settings": self.latent_settings,
                "last_launch": self.last_launch, "latents": self.latents, "images": self.images}
        try:
            atomic_write_text(self.path, json.dumps(data, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass  # a lost manifest only means less invalidation next time, never a lost file


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _stamp(path: Path) -> str | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return f"{st.st_size}:{st.st_mtime_ns}"


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


def latent_cache_files(subset: Subset) -> list[tuple[Path, Path]]:
    """(latent cache file, its image) pairs present in a subset."""
    found = []
    try:
        entries = sorted(subset.image_dir.iterdir())
    except OSError:
        return []
    images = {e.stem: e for e in entries if e.suffix.lower() in IMAGE_SUFFIXES}
    for entry in entries:
        m = _LATENT.match(entry.name)
        stem = m.group("stem") if m else entry.stem if entry.suffix == ".npz" else None
        if stem in images:
            found.append((entry, images[stem]))
    return found


def image_files(subset: Subset) -> list[Path]:
    try:
        return sorted(p for p in subset.image_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    except OSError:
        return []


def _built_from(cache: Path, recorded: str | None, at_last_launch: str | None, current: str | None,
                manifest: CacheManifest) -> str | None:
    """What a cache was built from: as recorded; else, for a cache built during the last attempt, its source
    as it was at that launch; else (older than trainsup's first look: nothing to compare with) the current."""
    if recorded is not None:
        return recorded
    try:
        fresh = cache.stat().st_mtime >= manifest.last_launch > 0
    except OSError:
        return None
    return at_last_launch if fresh else current


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
    seen_latents: set[str] = set()
    settings_changed = manifest.latent_settings is not None and manifest.latent_settings != latent_settings
    for subset in subsets:
        for cache, caption in te_cache_files(subset):
            current = _digest(caption)
            key = str(cache)
            built_from = _built_from(cache, manifest.te.get(key), manifest.captions.get(str(caption)), current,
                                     manifest)
            if built_from is not None and current is not None and built_from != current:
                stale.append((cache, subset))
                manifest.te.pop(key, None)
            else:
                manifest.te[key] = built_from or ""
                seen_te.add(key)
        for cache, image in latent_cache_files(subset):
            current = _stamp(image)
            key = str(cache)
            built_from = _built_from(cache, manifest.latents.get(key), manifest.images.get(str(image)), current,
                                     manifest)
            if settings_changed or (built_from is not None and current is not None and built_from != current):
                stale.append((cache, subset))
                manifest.latents.pop(key, None)
            else:
                manifest.latents[key] = built_from or ""
                seen_latents.add(key)
    manifest.te = {k: v for k, v in manifest.te.items() if k in seen_te}
    manifest.latents = {k: v for k, v in manifest.latents.items() if k in seen_latents}
    manifest.latent_settings = latent_settings
    manifest.captions = {str(c): d for s in subsets for c in caption_files(s) if (d := _digest(c))}
    manifest.images = {str(i): d for s in subsets for i in image_files(s) if (d := _stamp(i))}
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
