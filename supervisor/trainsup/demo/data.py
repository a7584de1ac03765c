"""The demo's dataset: kohya DreamBooth folders, captions, caches, batches and data order.

Owns finding images under `train_data_dir/N_name/` (N = repeats), reading
captions, the latent and text-encoder-output caches (in memory or as `.npz`
files next to each image, valid when the expected keys are present: like
sd-scripts, captions and resolution are never compared), the torch Dataset and
collate function fed to a real DataLoader, and the per-epoch order, a shuffle
seeded with `seed + epoch` that never touches the global RNGs.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from .logfmt import ProgressBar
from .model import IMAGE_SIZE, VAE, TextEncoder
from .png import read_png, resize_nearest

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png",)  # the demo decodes PNG only (no PIL)
LATENT_KEYS = ("latents",)
TE_KEYS = ("t5_out", "t5_attn_mask")


@dataclass
class ImageEntry:
    path: Path
    caption: str
    latents_npz: Path | None = None
    te_npz: Path | None = None


def read_caption(image: Path, extension: str) -> str | None:
    caption_file = image.with_suffix(extension)
    if caption_file.is_file():
        lines = caption_file.read_text(encoding="utf-8").strip().splitlines()
        return lines[0].strip() if lines else ""
    return None


def find_images(train_data_dir: str, caption_extension: str) -> list[ImageEntry]:
    """One entry per image and repeat, in kohya's folder order (sorted names)."""
    base = Path(train_data_dir)
    if not base.is_dir():
        return []
    entries: list[ImageEntry] = []
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        head, _, class_tokens = folder.name.partition("_")
        try:
            repeats = int(head)
        except ValueError:
            logger.warning(f"ignore directory without repeats / 繰り返し回数のないディレクトリを無視します: {folder}")
            continue
        images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
        logger.info(f"found directory {folder} contains {len(images)} image files")
        for image in images:
            caption = read_caption(image, caption_extension)
            # no caption file: kohya falls back to the class tokens of the folder name
            text = caption if caption is not None else class_tokens
            # separate objects per repeat: cache paths are filled in per entry later
            entries.extend(ImageEntry(image, text) for _ in range(repeats))
    if entries:
        logger.info(f"{len(entries)} train images with repeating.")
    return entries


def load_image(path: Path) -> torch.Tensor:
    """RGB image as a CHW float tensor in [-1, 1] at the model's fixed resolution."""
    rgb = resize_nearest(read_png(path), IMAGE_SIZE, IMAGE_SIZE)
    return torch.from_numpy(rgb.astype(np.float32) / 127.5 - 1.0).permute(2, 0, 1).contiguous()


def _npz_has_keys(path: Path, keys: tuple[str, ...]) -> bool:
    """kohya's cache validity check: the file opens and holds the keys; nothing else is compared."""
    if not path.exists():
        return False
    try:
        with np.load(path) as npz:
            return all(k in npz for k in keys)
    except Exception:
        logger.error(f"Error loading file: {path}")
        raise


def cache_latents(entries: list[ImageEntry], vae: VAE, to_disk: bool, suffix: str) -> dict[Path, torch.Tensor]:
    """Encode every distinct image once; on disk, files that already hold `latents` are reused."""
    logger.info("caching latents.")
    unique = list(dict.fromkeys(e.path for e in entries))
    in_memory: dict[Path, torch.Tensor] = {}
    npz_of = {p: p.with_name(f"{p.stem}_{IMAGE_SIZE:04d}x{IMAGE_SIZE:04d}{suffix}") for p in unique}
    bar = ProgressBar(len(unique))
    for path in unique:
        npz = npz_of[path]
        if not (to_disk and _npz_has_keys(npz, LATENT_KEYS)):
            with torch.no_grad():
                latents = vae.encode(load_image(path)[None].float())[0]
            if to_disk:
                np.savez(npz, latents=latents.numpy(), original_size=np.array([IMAGE_SIZE, IMAGE_SIZE]),
                         crop_ltrb=np.array([0, 0, IMAGE_SIZE, IMAGE_SIZE]))
            else:
                in_memory[path] = latents
        bar.update(1)
    bar.close()
    if to_disk:
        for entry in entries:
            entry.latents_npz = npz_of[entry.path]
    return in_memory


def cache_text_encoder_outputs(
    entries: list[ImageEntry], text_encoder: TextEncoder, to_disk: bool, suffix: str
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Encode every caption once (keyed by caption text); on disk, one npz per image."""
    logger.info("caching Text Encoder outputs...")
    in_memory: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    unique = list(dict.fromkeys(e.path for e in entries))
    captions = {e.path: e.caption for e in entries}
    npz_of = {p: p.with_name(f"{p.stem}{suffix}") for p in unique}
    bar = ProgressBar(len(unique))
    for path in unique:
        caption = captions[path]
        if to_disk:
            if not _npz_has_keys(npz_of[path], TE_KEYS):
                hidden, mask = text_encoder.encode_texts([caption])
                pooled = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
                np.savez(npz_of[path], t5_out=hidden[0].numpy(), t5_attn_mask=mask[0].numpy(),
                         l_pooled=pooled[0].numpy())
        elif caption not in in_memory:
            hidden, mask = text_encoder.encode_texts([caption])
            in_memory[caption] = (hidden[0], mask[0])
        bar.update(1)
    bar.close()
    if to_disk:
        for entry in entries:
            entry.te_npz = npz_of[entry.path]
    return in_memory


class DemoDataset(Dataset[dict[str, Any]]):
    """Items carry the caption plus latents (cached) or the image, and disk-cached TE outputs."""

    def __init__(self, entries: list[ImageEntry], latents: dict[Path, torch.Tensor]) -> None:
        self.entries = entries
        self.latents = latents

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, index: int) -> dict[str, Any]:
        entry = self.entries[index]
        item: dict[str, Any] = {"caption": entry.caption}
        if entry.path in self.latents:
            item["latents"] = self.latents[entry.path]
        elif entry.latents_npz is not None:
            with np.load(entry.latents_npz) as npz:
                item["latents"] = torch.from_numpy(npz["latents"].copy())
        else:
            item["image"] = load_image(entry.path)
        if entry.te_npz is not None:
            with np.load(entry.te_npz) as npz:
                item["te_hidden"] = torch.from_numpy(npz["t5_out"].copy())
                item["te_mask"] = torch.from_numpy(npz["t5_attn_mask"].copy())
        return item


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    batch: dict[str, Any] = {"captions": [item["caption"] for item in items]}
    for key in ("latents", "image", "te_hidden", "te_mask"):
        if key in items[0]:
            batch[key] = torch.stack([item[key] for item in items])
    return batch


class EpochShuffleSampler(Sampler[int]):
    """Data order of one epoch: a shuffle seeded with seed + epoch, as kohya seeds its buckets.

    A private random.Random is used so that neither data order nor skipped batches move the
    global RNG streams the training noise comes from (resume depends on that).
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.seed = seed
        self.epoch = 1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.size))
        random.Random(self.seed + self.epoch).shuffle(order)
        return iter(order)

    def __len__(self) -> int:
        return self.size
