"""Everything the demo trainer sets up before its first step, in sd-scripts' order.

Owns seeding, the dataset check ("No data found" ends the run with exit 0),
loading and moving the base model (where a wrong fp8 key layout fails inside
torch), the fp8_base rules, latent and text-encoder caching, creating the LoRA
network, optimizer, scheduler and DataLoader, and handing all of it to the
training loop as one `Session`.
"""

from __future__ import annotations

import argparse
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from . import faults
from .arch import Arch
from .data import (
    DemoDataset,
    EpochShuffleSampler,
    ImageEntry,
    cache_latents,
    cache_text_encoder_outputs,
    collate,
    find_images,
)
from .dataset_config import load_dataset_config
from .model import BaseModel, load_base_model
from .network import LoRANetwork
from .sampling import SampleWriter, TeOutput, cache_prompt_outputs

logger = logging.getLogger(__name__)


@dataclass
class Session:
    args: argparse.Namespace
    arch: Arch
    sim: faults.Simulation
    entries: list[ImageEntry]
    model: BaseModel
    network: LoRANetwork
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler_state: dict[str, Any] | None
    sampler: EpochShuffleSampler
    dataloader: DataLoader[Any]
    caption_cache: dict[str, TeOutput] | None
    sample_writer: SampleWriter | None
    autocast: bool

    @property
    def latents_cached(self) -> bool:
        return bool(self.args.cache_latents)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _load_model(args: argparse.Namespace, arch: Arch) -> BaseModel:
    model = load_base_model(Path(args.pretrained_model_name_or_path), arch.name, bool(args.fp8_base))
    # the move that fails with "Cannot copy out of meta tensor" when keys did not match
    assert model.text_encoder is not None
    model.text_encoder.to("cpu")
    model.vae.to("cpu")
    model.unet.to("cpu")
    if args.fp8_base:
        assert (
            args.mixed_precision != "no"
        ), ("fp8_base requires mixed precision='fp16' or 'bf16' / "
            "fp8を使う場合はmixed_precision='fp16'または'bf16'が必要です。")
        print("enable fp8 training for U-Net.")
        logger.info(f"set U-Net weight dtype to {torch.float8_e4m3fn}")
        model.unet.to(dtype=torch.float8_e4m3fn)
    for part in (model.text_encoder, model.vae, model.unet):
        part.requires_grad_(False)
        part.eval()
    model.unet.gradient_checkpointing = bool(args.gradient_checkpointing)
    return model


def _make_optimizer(args: argparse.Namespace, network: LoRANetwork) -> torch.optim.Optimizer:
    if str(args.optimizer_type).lower() != "adamw":
        raise ValueError(f"the demo trainer only has AdamW, not optimizer_type={args.optimizer_type!r}")
    optimizer = torch.optim.AdamW(network.trainable_params(), lr=args.learning_rate)
    logger.info("use AdamW optimizer | {}")
    return optimizer


def prepare(args: argparse.Namespace, arch: Arch, sim: faults.Simulation) -> Session | None:
    """Build the session, or return None when there is no data (kohya exits 0 then)."""
    if args.seed is None:
        # like sd-scripts: without --seed every start trains with a different seed
        args.seed = random.randint(0, 2**32 - 1)
    set_seed(args.seed)

    cacheable = not (args.color_aug or args.random_crop)
    if args.dataset_config:
        spec = load_dataset_config(args.dataset_config, args)
        entries, cacheable = spec.entries, spec.latent_cacheable
        args.train_batch_size = spec.batch_size  # a dataset's batch_size wins, as in kohya
    else:
        entries = find_images(args.train_data_dir, args.caption_extension)
    if not entries:
        logger.error(
            "No data found. Please verify arguments (train_data_dir must be the parent of folders with images)"
            " / 画像がありません。引数指定を確認してください（train_data_dirには画像があるフォルダではなく、"
            "画像があるフォルダの親フォルダを指定する必要があります）"
        )
        return None

    if args.cache_latents:
        assert cacheable, ("when caching latents, either color_aug or random_crop cannot be used / "
                           "latentをキャッシュするときはcolor_augとrandom_cropは使えません")
    model = _load_model(args, arch)
    latents: dict[Path, torch.Tensor] = {}
    if args.cache_latents:
        latents = cache_latents(entries, model.vae, bool(args.cache_latents_to_disk), arch.latents_suffix)

    caption_cache: dict[str, TeOutput] | None = None
    prompt_cache: dict[str, TeOutput] | None = None
    if arch.caches_text_encoder and getattr(args, "cache_text_encoder_outputs", False):
        assert model.text_encoder is not None and arch.te_suffix is not None
        to_disk = bool(args.cache_text_encoder_outputs_to_disk)
        caption_cache = cache_text_encoder_outputs(entries, model.text_encoder, to_disk, arch.te_suffix)
        if to_disk:
            caption_cache = None  # batches bring the outputs from the npz files
        if args.sample_prompts is not None and Path(args.sample_prompts).is_file():
            prompt_cache = cache_prompt_outputs(Path(args.sample_prompts), model.text_encoder)
        else:
            prompt_cache = {}
        logger.info("text_encoder is not needed for training. deleting to save memory.")
        model.text_encoder = None

    logger.info(f"import network module: {args.network_module}")
    network = LoRANetwork(model.unet, args.network_dim, args.network_alpha, bool(args.fp8_base))
    logger.info(f"create LoRA network. base dim (rank): {args.network_dim}, alpha: {args.network_alpha}")
    logger.info(f"create LoRA for U-Net: {len(network.loras)} modules.")
    network.apply_to()
    optimizer = _make_optimizer(args, network)
    # constant schedule, stepped once per optimizer step like kohya's scheduler
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    scaler_state = torch.amp.GradScaler("cpu").state_dict() if args.mixed_precision == "fp16" else None

    sampler = EpochShuffleSampler(len(entries), args.seed)
    dataloader: DataLoader[Any] = DataLoader(
        DemoDataset(entries, latents),
        batch_size=args.train_batch_size,
        sampler=sampler,
        collate_fn=collate,
        num_workers=args.max_data_loader_n_workers,
        # a private generator: creating an iterator must not draw from the global torch RNG
        generator=torch.Generator().manual_seed(args.seed),
    )

    sample_writer = None
    if args.sample_prompts is not None:
        sample_writer = SampleWriter(
            arch, Path(args.sample_prompts), Path(args.output_dir), args.output_name,
            args.mixed_precision != "no", sim,
        )
        sample_writer.prompt_cache = prompt_cache
    return Session(
        args=args, arch=arch, sim=sim, entries=entries, model=model, network=network,
        optimizer=optimizer, scheduler=scheduler, scaler_state=scaler_state, sampler=sampler,
        dataloader=dataloader, caption_cache=caption_cache, sample_writer=sample_writer,
        autocast=args.mixed_precision != "no",
    )
