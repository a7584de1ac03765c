"""Saving and loading training states the way sd-scripts + accelerate do it.

Owns the state directory layout and write order (`train_state.json`,
`model.safetensors`, `optimizer.bin`, `scheduler.bin`, `scaler.pt` for fp16,
`random_states_0.pkl` last; nothing atomic, no marker; paced between files when
asked), accelerate's log lines
for both directions (including the `sampler.bin` it logs but never writes),
kohya's train_state.json hooks, and the state/weights file names.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_file

from .logfmt import log_as
from .network import LoRANetwork

logger = logging.getLogger(__name__)

DEFAULT_STEP_NAME = "at"
DEFAULT_EPOCH_NAME = "epoch"
DEFAULT_LAST_NAME = "last"


def step_weights_name(output_name: str | None, step: int) -> str:
    return f"{output_name or DEFAULT_STEP_NAME}-step{step:08d}.safetensors"


def epoch_weights_name(output_name: str | None, epoch: int) -> str:
    return f"{output_name or DEFAULT_EPOCH_NAME}-{epoch:06d}.safetensors"


def last_weights_name(output_name: str | None) -> str:
    return f"{output_name or DEFAULT_LAST_NAME}.safetensors"


def step_state_name(output_name: str | None, step: int) -> str:
    return f"{output_name or DEFAULT_STEP_NAME}-step{step:08d}-state"


def epoch_state_name(output_name: str | None, epoch: int) -> str:
    return f"{output_name or DEFAULT_EPOCH_NAME}-{epoch:06d}-state"


def last_state_name(output_name: str | None) -> str:
    return f"{output_name or DEFAULT_LAST_NAME}-state"


def save_state(
    state_dir: Path,
    network: LoRANetwork,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler_state: dict[str, Any] | None,
    epoch: int,
    step: int,
    pause: Callable[[int], None] | None = None,
) -> None:
    """accelerator.save_state with kohya's pre-hook; each file is written in place, in order.

    ``pause(gaps)`` is called between two files (``gaps`` of them in this save): the demo's paced
    saves, so that a kill can land between files as it does on a slow disk.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    log_as("accelerator.py", 3067, f"Saving current state to {state_dir}")

    def train_state() -> None:
        train_state_file = state_dir / "train_state.json"
        logger.info(f"save train state to {train_state_file} at epoch {epoch} step {step}")
        with open(train_state_file, "w", encoding="utf-8") as f:
            json.dump({"current_epoch": epoch, "current_step": step}, f)

    def model() -> None:
        model_file = state_dir / "model.safetensors"
        # a safetensors without float8 support fails right here, leaving a partial state behind
        save_file(network.state_tensors(), str(model_file), metadata={"format": "pt"})
        log_as("checkpointing.py", 102, f"Model weights saved in {model_file}")

    def optimizer_state() -> None:
        optimizer_file = state_dir / "optimizer.bin"
        torch.save(optimizer.state_dict(), optimizer_file)
        log_as("checkpointing.py", 111, f"Optimizer state saved in {optimizer_file}")

    def scheduler_state() -> None:
        scheduler_file = state_dir / "scheduler.bin"
        torch.save(scheduler.state_dict(), scheduler_file)
        log_as("checkpointing.py", 118, f"Scheduler state saved in {scheduler_file}")
        # accelerate logs this for every dataloader but writes it only for its own seedable sampler
        log_as("checkpointing.py", 140, f"Sampler state for dataloader 0 saved in {state_dir / 'sampler.bin'}")
        log_as("checkpointing.py", 140, f"Sampler state for dataloader 1 saved in {state_dir / 'sampler_1.bin'}")

    def scaler() -> None:
        scaler_file = state_dir / "scaler.pt"
        torch.save(scaler_state, scaler_file)
        log_as("checkpointing.py", 147, f"Gradient scaler state saved in {scaler_file}")

    def random_states() -> None:
        states = {
            "random_state": random.getstate(),
            "numpy_random_seed": np.random.get_state(),
            "torch_manual_seed": torch.get_rng_state(),
        }
        states_file = state_dir / "random_states_0.pkl"
        torch.save(states, states_file)
        log_as("checkpointing.py", 170, f"Random states saved in {states_file}")

    writers = [train_state, model, optimizer_state, scheduler_state]
    writers += [scaler] if scaler_state is not None else []
    writers.append(random_states)
    for index, write in enumerate(writers):
        if index and pause is not None:
            pause(len(writers) - 1)
        write()


def load_state(
    state_dir: Path,
    network: LoRANetwork,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    fp16: bool,
) -> tuple[int | None, dict[str, Any] | None]:
    """accelerator.load_state with kohya's pre-hook. Returns (steps_from_state, scaler state).

    Loading is strict: a network built with other flags (dim, fp8_base) fails here.
    """
    if not state_dir.is_dir():
        raise ValueError(f"Tried to find {state_dir} but folder does not exist")
    log_as("accelerator.py", 3215, f"Loading states from {state_dir}")
    steps_from_state: int | None = None
    train_state_file = state_dir / "train_state.json"
    # kohya reads the step only when the file exists; a missing file silently means step 0
    if train_state_file.exists():
        with open(train_state_file, encoding="utf-8") as f:
            data = json.load(f)
        steps_from_state = data["current_step"]
        logger.info(f"load train state from {train_state_file}: {data}")

    # accelerate passes device=, which safetensors < 0.4.3 rejects
    load_model(network, str(state_dir / "model.safetensors"), strict=True, device="cpu")
    log_as("checkpointing.py", 210, "All model weights loaded successfully")
    optimizer.load_state_dict(torch.load(state_dir / "optimizer.bin", map_location="cpu", weights_only=True))
    log_as("checkpointing.py", 221, "All optimizer states loaded successfully")
    scheduler.load_state_dict(torch.load(state_dir / "scheduler.bin", weights_only=True))
    log_as("checkpointing.py", 228, "All scheduler states loaded successfully")
    log_as("checkpointing.py", 247, "All dataloader sampler states loaded successfully")
    scaler_state: dict[str, Any] | None = None
    if fp16:
        scaler_state = torch.load(state_dir / "scaler.pt", weights_only=True)
        log_as("checkpointing.py", 254, "GradScaler state loaded successfully")
    # accelerate swallows any failure here and resumes with whatever RNG state it has
    try:
        states = torch.load(state_dir / "random_states_0.pkl", weights_only=False)
        random.setstate(states["random_state"])
        np.random.set_state(states["numpy_random_seed"])
        torch.set_rng_state(states["torch_manual_seed"])
        log_as("checkpointing.py", 283, "All random states loaded successfully")
    except Exception:  # noqa: BLE001 - accelerate catches everything here too
        log_as("checkpointing.py", 285, "Could not load random states")
    return steps_from_state, scaler_state
