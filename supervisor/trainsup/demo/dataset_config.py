"""Owns the demo's reading of kohya's ``--dataset_config``: ``[general]``, ``[[datasets]]`` and
``[[datasets.subsets]]``, as sd-scripts reads them.

Values cascade subset > dataset > general > command line. Every key kohya's schema knows is
accepted (unknown ones fail like kohya's: ``Invalid user config`` and a voluptuous-style error);
the demo honours the ones that matter to a supervisor: ``image_dir`` (images directly in it),
``num_repeats``, ``caption_extension``, ``batch_size`` (which wins over ``--train_batch_size``) and
``color_aug`` / ``random_crop`` (which forbid latent caching). It trains every dataset at its fixed
resolution, with the first dataset's batch size.
"""

from __future__ import annotations

import argparse
import logging
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .data import IMAGE_EXTENSIONS, ImageEntry, read_caption

logger = logging.getLogger(__name__)

# The key names of sd-scripts' dataset-config schema (library/config_util.py), DreamBooth style.
_SUBSET_KEYS = frozenset({
    "color_aug", "face_crop_aug_range", "flip_aug", "num_repeats", "random_crop", "shuffle_caption",
    "keep_tokens", "keep_tokens_separator", "secondary_separator", "caption_separator", "enable_wildcard",
    "token_warmup_min", "token_warmup_step", "caption_prefix", "caption_suffix", "custom_attributes",
    "resize_interpolation", "caption_dropout_every_n_epochs", "caption_dropout_rate",
    "caption_tag_dropout_rate", "caption_extension", "class_tokens", "cache_info", "image_dir", "is_reg",
    "alpha_mask",
})
_DATASET_KEYS = frozenset({
    "batch_size", "bucket_no_upscale", "bucket_reso_steps", "enable_bucket", "max_bucket_reso",
    "min_bucket_reso", "validation_seed", "validation_split", "resolution", "network_multiplier",
    "resize_interpolation", "debug_dataset", "max_token_length", "prior_loss_weight",
})
_GENERAL_KEYS = (_SUBSET_KEYS | _DATASET_KEYS) - {"image_dir", "is_reg", "alpha_mask"}


@dataclass
class DatasetSpec:
    entries: list[ImageEntry]
    batch_size: int
    latent_cacheable: bool  # no color_aug / random_crop anywhere


class InvalidUserConfig(ValueError):
    pass


def _check_keys(table: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            logger.error("Invalid user config / ユーザ設定の形式が正しくないようです")
            raise InvalidUserConfig(f"extra keys not allowed @ data{where}['{key}']")


def load_dataset_config(path: str, args: argparse.Namespace) -> DatasetSpec:
    logger.info(f"Loading dataset config from {path}")
    with open(path, "rb") as f:
        config = tomllib.load(f)
    _check_keys(config, frozenset({"general", "datasets"}), "")
    general = config.get("general", {})
    _check_keys(general, _GENERAL_KEYS, "['general']")
    entries: list[ImageEntry] = []
    batch_sizes: list[int] = []
    cacheable = not (getattr(args, "color_aug", False) or getattr(args, "random_crop", False))
    for d, dataset in enumerate(config.get("datasets", [])):
        _check_keys(dataset, _DATASET_KEYS | _SUBSET_KEYS | {"subsets"} - {"image_dir"}, f"['datasets'][{d}]")
        batch_sizes.append(int(dataset.get("batch_size", general.get("batch_size", args.train_batch_size))))
        for s, subset in enumerate(dataset.get("subsets", [])):
            _check_keys(subset, _SUBSET_KEYS, f"['datasets'][{d}]['subsets'][{s}]")
            values = {**general, **dataset, **subset}
            cacheable = cacheable and not values.get("color_aug") and not values.get("random_crop")
            entries.extend(_subset_entries(values, args))
    if len(set(batch_sizes)) > 1:
        logger.warning(f"the demo trains every dataset with the first one's batch size ({batch_sizes[0]})")
    batch = batch_sizes[0] if batch_sizes else args.train_batch_size
    if entries:
        logger.info(f"{len(entries)} train images with repeating.")
    return DatasetSpec(entries, batch, cacheable)


def _subset_entries(values: dict[str, Any], args: argparse.Namespace) -> list[ImageEntry]:
    image_dir = Path(str(values.get("image_dir", "")))
    if not image_dir.is_dir():
        logger.warning(f"not directory: {image_dir}")
        return []
    extension = str(values.get("caption_extension", args.caption_extension))
    repeats = int(values.get("num_repeats", 1))
    images = sorted(p for p in image_dir.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
    logger.info(f"found directory {image_dir} contains {len(images)} image files")
    entries: list[ImageEntry] = []
    for image in images:
        caption = read_caption(image, extension)
        entries.extend(ImageEntry(image, caption or str(values.get("class_tokens", ""))) for _ in range(repeats))
    return entries
