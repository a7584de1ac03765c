"""Owns musubi-tuner's caches as trainsup sees them: which caching scripts make them for a training
script, the commands that re-run them, and what a dataset's ``cache_directory`` lacks or holds stale.

musubi trains only from the caches (``prepare_for_training`` globs ``cache_directory``): a latent
cache ``{item}_{W}x{H}_{arch}.safetensors`` (a video's ``{item}_{pos}-{frames}_{W}x{H}_{arch}``)
paired with a text-encoder cache ``{item}_{arch}_te.safetensors`` whose ``caption1`` metadata is the
caption it was made from. Both are written by separate scripts run before training
(``wan_cache_latents.py``, ``wan_cache_text_encoder_outputs.py``, ...); the trainer never checks
them against the images or captions. So a latent cache without its text-encoder cache skips the
item (a WARNING line), no cache at all stops the run (``No training items found``, exit 1), and an
edited caption or image changes nothing until both scripts run again. Everything here reads file
names, times and safetensors headers; nothing is written, least of all into the user's caches.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...trainers.cmdline import TrainerCommand, find_script
from ...trainers.sthead import HeaderError, load_header

# musubi's media_utils: the image and video suffixes its directory datasets read.
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".avif", ".jxl"})
VIDEO_SUFFIXES = frozenset({".mp4", ".webm", ".avi", ".mkv", ".mov", ".flv", ".wmv", ".m4v", ".gif"})
SHOWN = 5  # item names a finding lists before "and N more"
# Dataset keys only its caching scripts read (how images and frames become latents, which caption
# file becomes a text-encoder cache): the trainer itself reads the caches, so an edit of one changes
# nothing until they are made again.
CACHE_BOUND = ("resolution", "enable_bucket", "bucket_no_upscale", "caption_extension", "target_frames",
               "frame_extraction", "frame_stride", "frame_sample", "max_frames", "source_fps", "target_fps")
# Of those, the ones only the latent caching reads: trainsup can make those caches again itself, in the
# run dir, with the VAE the training command names (a caption needs the text encoder, minutes and ~10 GB).
LATENT_BOUND = tuple(k for k in CACHE_BOUND if k != "caption_extension")


@dataclass(frozen=True)
class Caching:
    """A training script's two caching scripts, the architecture tags in its cache names, and the flags
    of its training command (model paths, variants) the caching scripts take too."""

    prefix: str  # ``wan_`` -> wan_cache_latents.py, wan_cache_text_encoder_outputs.py
    architectures: tuple[str, ...]  # dataset/architectures.py's short names; several where a flag picks one
    latent_flags: tuple[str, ...] = ("vae",)
    text_flags: tuple[str, ...] = ("text_encoder",)
    latents_script: str = "cache_latents"
    latent_optional: tuple[str, ...] = ()  # passed on when the training command gives them

    @property
    def latents(self) -> str:
        return f"{self.prefix}{self.latents_script}"

    @property
    def text(self) -> str:
        return f"{self.prefix}cache_text_encoder_outputs"


_HV = Caching("", ("hv",), text_flags=("text_encoder1", "text_encoder2"))
_QWEN = Caching("qwen_image_", ("qi", "qie", "qil"))
_FLUX2 = Caching("flux_2_", ("f2d", "f2k4b", "f2k9b"), text_flags=("text_encoder", "model_version"))
_ZIMAGE = Caching("zimage_", ("zi",))
_HIDREAM = Caching("hidream_o1_", ("ho1",), latent_flags=(), text_flags=("dit", "model_type"),
                   latents_script="cache_pixel")
# Every training script of the snapshot (profile.SCRIPTS), by its caching scripts.
CACHING: dict[str, Caching] = {
    # Wan's image-to-video tasks cache the first frame with CLIP too (``--clip`` turns ``--i2v`` on)
    "wan_train_network": Caching("wan_", ("wan",), text_flags=("t5",), latent_optional=("clip",)),
    "hv_train_network": _HV, "hv_train": _HV,
    "hv_1_5_train_network": Caching("hv_1_5_", ("hv15",), text_flags=("text_encoder", "byt5")),
    "fpack_train_network": Caching("fpack_", ("fp",), latent_flags=("vae", "image_encoder"),
                                   text_flags=("text_encoder1", "text_encoder2")),
    "flux_kontext_train_network": Caching("flux_kontext_", ("fk",), text_flags=("text_encoder1", "text_encoder2")),
    "flux_2_train_network": _FLUX2, "flux_2_train_network_self_flow": _FLUX2,
    "qwen_image_train_network": _QWEN, "qwen_image_train": _QWEN,
    "zimage_train_network": _ZIMAGE, "zimage_train": _ZIMAGE,
    "kandinsky5_train_network": Caching("kandinsky5_", ("k5",), text_flags=("text_encoder_qwen", "text_encoder_clip")),
    "krea2_train_network": Caching("krea2_", ("kr2",)),
    "hidream_o1_train_network": _HIDREAM, "hidream_o1_train": _HIDREAM,
    "ideogram4_train_network": Caching("ideogram4_", ("i4",)),
}


def caching_for(script: str) -> Caching | None:
    return CACHING.get(script)


def caching_commands(command: TrainerCommand, dataset_config: str) -> list[str] | None:
    """The two caching commands for this training command's dataset TOML, next to its script, with the
    model paths its command gives (a placeholder in capitals where it gives none: musubi's training
    command needs its VAE and text encoder only for sampling); None for a script whose caching scripts
    are not known."""
    found = caching_argv(command, dataset_config)
    return None if found is None else [shlex.join(found[0]), shlex.join(found[1])]


def latent_models_known(command: TrainerCommand) -> bool:
    """Whether the training command names every model its latent caching needs (Wan: ``--vae``), so
    that trainsup can run that caching itself."""
    caching = caching_for(command.script)
    return caching is not None and all(command.get(flag) for flag in caching.latent_flags)


def caching_argv(command: TrainerCommand, dataset_config: str) -> tuple[list[str], list[str]] | None:
    """The latent and the text-encoder caching commands (see ``caching_commands``), as argv lists."""
    caching = caching_for(command.script)
    if caching is None:
        return None
    launcher = command.launcher
    try:
        at = find_script(launcher)
    except ValueError:
        at = len(launcher) - 1
    token = launcher[at]
    head, _, first = launcher[0].rpartition("/")
    # The caching scripts run under the trainer's Python: the launcher itself, or the python next to
    # its accelerate (a venv's bin/).
    python = launcher[0] if first.startswith("python") else \
        f"{head}/python" if head and Path(f"{head}/python").exists() else "python"

    def script(name: str) -> list[str]:
        if at > 0 and launcher[at - 1] == "-m":
            return [python, "-m", f"{token.rsplit('.', 1)[0]}.{name}" if "." in token else name]
        head = token.rsplit("/", 1)[0] + "/" if "/" in token else ""
        return [python, f"{head}{name}.py"]

    def models(flags: tuple[str, ...], required: tuple[str, ...]) -> list[str]:
        out: list[str] = []
        for flag in flags:
            value = command.get(flag)
            if value is not None:
                out += [f"--{flag}", value]
            elif flag in required:
                out += [f"--{flag}", flag.upper()]
        return out

    latents = script(caching.latents) + ["--dataset_config", dataset_config] + models(
        caching.latent_flags + caching.latent_optional, caching.latent_flags)
    text = script(caching.text) + ["--dataset_config", dataset_config] + models(
        caching.text_flags, tuple(f for f in caching.text_flags if f not in ("model_version", "model_type", "dit")))
    return latents, text


# --- a dataset's caches ------------------------------------------------------------------------------

def _resolve(value: object, cwd: Path) -> Path | None:
    if not isinstance(value, str) or not value:
        return None
    p = Path(value).expanduser()
    return p if p.is_absolute() else cwd / p


@dataclass(frozen=True)
class Dataset:
    """One ``[[datasets]]`` table: where its media and its caches are (``general``'s keys under it)."""

    index: int
    cache_dir: Path | None  # cache_directory, else the media directory (musubi's default)
    media_dir: Path | None  # image_directory or video_directory; None for a JSONL dataset
    video: bool
    caption_extension: str | None

    def media(self) -> list[Path]:
        """Its images or videos, as musubi's directory datasource globs them."""
        suffixes = VIDEO_SUFFIXES if self.video else IMAGE_SUFFIXES
        try:
            return sorted(p for p in (self.media_dir.iterdir() if self.media_dir else ())
                          if p.is_file() and p.suffix.lower() in suffixes)
        except OSError:
            return []

    def caption_for(self, media: Path) -> Path | None:
        return media.with_suffix(self.caption_extension) if self.caption_extension else None


def datasets(doc: dict[str, Any], cwd: Path) -> list[Dataset]:
    found = doc.get("general")
    general: dict[str, Any] = found if isinstance(found, dict) else {}
    out = []
    tables = doc.get("datasets")
    for i, table in enumerate(tables if isinstance(tables, list) else []):
        if not isinstance(table, dict):
            continue
        ds = {**general, **table}
        video = ds.get("video_directory") is not None or ds.get("video_jsonl_file") is not None
        media = _resolve(ds.get("video_directory" if video else "image_directory"), cwd)
        ext = ds.get("caption_extension")
        out.append(Dataset(i, _resolve(ds.get("cache_directory"), cwd) or media, media, video,
                           ext if isinstance(ext, str) and ext else None))
    return out


def cache_bound_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The ``CACHE_BOUND`` keys an edit of the dataset TOML changes (``[general]`` under each dataset,
    as musubi merges it); ``[[datasets]]`` itself when datasets were added or removed."""
    def view(doc: dict[str, Any]) -> list[dict[str, Any]]:
        found, listed = doc.get("general"), doc.get("datasets")
        general: dict[str, Any] = found if isinstance(found, dict) else {}
        tables: list[Any] = listed if isinstance(listed, list) else []
        return [{k: {**general, **t}.get(k) for k in CACHE_BOUND} for t in tables if isinstance(t, dict)]

    before, after = view(old), view(new)
    if len(before) != len(after):
        return ["[[datasets]]"]
    return [k for k in CACHE_BOUND if any(b[k] != a[k] for b, a in zip(before, after))]


def _latent_name(architectures: tuple[str, ...], video: bool) -> re.Pattern[str]:
    frames = r"_\d+-\d+(?:-\d+)?" if video else ""
    arch = "|".join(re.escape(a) for a in architectures) if architectures else r"[a-z0-9]+"
    return re.compile(rf"^(?P<item>.+?){frames}_\d+x\d+_(?P<arch>{arch})\.safetensors$")


@dataclass
class CacheReport:
    """What one dataset's caches hold, by item (the media file's stem, musubi's item key)."""

    dataset: Dataset
    latents: dict[str, list[Path]] = field(default_factory=dict)  # item -> its latent caches
    trainable: int = 0  # items with a latent cache and its text-encoder cache: what musubi trains on
    no_te: list[str] = field(default_factory=list)  # a latent cache without its TE cache: skipped
    uncached: list[str] = field(default_factory=list)  # media without a latent cache: not trained on
    orphans: list[str] = field(default_factory=list)  # a latent cache whose media is gone: still trained on
    stale_captions: list[str] = field(default_factory=list)  # caption text != the TE cache's caption1
    stale_media: list[str] = field(default_factory=list)  # media newer than its latent cache


def _caption1(path: Path) -> str | None:
    try:
        meta = load_header(path).entries.get("__metadata__")
    except (HeaderError, OSError):
        return None
    value = meta.get("caption1") if isinstance(meta, dict) else None
    return value if isinstance(value, str) else None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def inspect(dataset: Dataset, architectures: tuple[str, ...]) -> CacheReport:
    """Read one dataset's cache directory against its media and captions (names, times, headers)."""
    report = CacheReport(dataset)
    cache = dataset.cache_dir
    if cache is None or not cache.is_dir():
        return report
    pattern = _latent_name(architectures, dataset.video)
    te: dict[str, Path] = {}
    try:
        entries = sorted(cache.iterdir())
    except OSError:
        return report
    for entry in entries:
        m = pattern.match(entry.name)
        if m is not None:
            report.latents.setdefault(m.group("item"), []).append(entry)
            te.setdefault(m.group("item"), cache / f"{m.group('item')}_{m.group('arch')}_te.safetensors")
    for item in sorted(report.latents):
        if te[item].is_file():
            report.trainable += 1
        else:
            report.no_te.append(item)
    if dataset.media_dir is None:
        return report  # a JSONL dataset: its captions are in the JSONL; only the pairs are checked
    media = {m.stem: m for m in dataset.media()}
    report.uncached = [s for s in sorted(media) if s not in report.latents]
    report.orphans = [s for s in sorted(report.latents) if s not in media]
    for item, path in sorted(media.items()):
        if item not in report.latents:
            continue
        made = [t for t in (_mtime(c) for c in report.latents[item]) if t is not None]
        shot = _mtime(path)
        if made and shot is not None and shot > min(made):
            report.stale_media.append(item)
        caption = dataset.caption_for(path)
        if caption is None or not te[item].is_file():
            continue
        try:
            text = caption.read_text(encoding="utf-8").strip()  # as musubi reads it
        except (OSError, UnicodeDecodeError):
            continue
        made_from = _caption1(te[item])
        if made_from is not None and made_from != text:
            report.stale_captions.append(item)
    return report


def shown(items: list[str]) -> str:
    head = ", ".join(items[:SHOWN])
    return head + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def is_input(path: Path, sets: list[Dataset]) -> bool:
    """Whether ``path`` is an image, video or caption of one of these datasets: a file musubi reads
    only through its caches."""
    for ds in sets:
        if ds.media_dir is None or path.parent.resolve() != ds.media_dir.resolve():
            continue
        if path.suffix.lower() in (VIDEO_SUFFIXES if ds.video else IMAGE_SUFFIXES):
            return True
        if ds.caption_extension and path.name.endswith(ds.caption_extension):
            return True
    return False
