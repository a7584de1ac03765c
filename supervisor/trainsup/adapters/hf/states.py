"""Owns the Trainer's saved states: the ``checkpoint-N/`` folders directly in the output dir, when one is
complete, and which one a launch may resume from.

``Trainer._save_checkpoint`` writes, in this order (an strace of the real bed): the model's config files,
its weights (``model.safetensors``, sharded as ``model-0000K-of-0000M.safetensors`` with an index, or a
PEFT adapter's ``adapter_model.safetensors``; ``*.bin`` without safe serialization), the tokenizer's
files, ``training_args.bin``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth`` (``rng_state_N.pth``
per process), and **``trainer_state.json`` last**. Nothing marks the end but that last file, and the
Trainer's own "latest" (``get_last_checkpoint``) takes the highest ``checkpoint-N`` folder unchecked, so a
folder cut by a kill is loaded and crashes the resume. Complete here means: ``trainer_state.json`` parses
and its ``global_step`` is the N of the folder's name, the weights' safetensors headers cover their files,
the optimizer, scheduler and RNG files are there and not empty, and no ``.tmp*`` file of an atomic write
is left behind.

A checkpoint whose ``global_step`` reached its own ``max_steps`` is the end of the run: the Trainer
resumed from it trains one step more (it wrote ``checkpoint-21`` of a 20-step run on the bed), so it is
never a resume point (``at_end``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ...trainers.accelerate import check_safetensors

CHECKPOINT = re.compile(r"checkpoint-(\d+)")  # the Trainer's own pattern (its regex is anchored the same)
TRAINER_STATE = "trainer_state.json"  # written last
WEIGHTS = ("adapter_model.safetensors", "model.safetensors", "adapter_model.bin", "pytorch_model.bin")
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
OPTIMIZER, SCHEDULER = "optimizer.pt", "scheduler.pt"


def trainer_state(path: Path) -> dict[str, Any] | None:
    """The checkpoint's ``trainer_state.json``, or None when it is missing or does not parse."""
    try:
        data = json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _nonempty(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def _weights_problem(path: Path) -> str:
    """'' when the checkpoint's weights are whole: a single file, or every shard its index names."""
    for index_name in SHARD_INDEXES:
        index = path / index_name
        if not index.is_file():
            continue
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            return f"{index_name} does not parse"
        for shard in shards:
            problem = _file_problem(path / str(shard))
            if problem:
                return problem
        return ""
    for name in WEIGHTS:
        if (path / name).exists():
            return _file_problem(path / name)
    return "no model weights (model.safetensors, adapter_model.safetensors or a shard index)"


def _file_problem(weights: Path) -> str:
    if not _nonempty(weights):
        return f"{weights.name} missing or empty"
    return check_safetensors(weights) if weights.suffix == ".safetensors" else ""


def checkpoint_problem(path: Path) -> str:
    """'' when ``path`` is a complete checkpoint of the Trainer, else why not."""
    if not path.is_dir():
        return "not a directory"
    m = CHECKPOINT.fullmatch(path.name)
    state = trainer_state(path)
    if state is None:
        return f"{TRAINER_STATE} missing or unreadable (the save did not finish)"
    if m is not None and state.get("global_step") != int(m.group(1)):
        return f"{TRAINER_STATE} says global_step {state.get('global_step')!r}, the folder's name {m.group(1)}"
    leftovers = sorted(p.name for p in path.glob(".tmp*"))
    if leftovers:
        return f"{leftovers[0]} left by a write that did not finish"
    problem = _weights_problem(path)
    if problem:
        return problem
    # DeepSpeed keeps the optimizer in global_stepN/ instead of optimizer.pt
    if not _nonempty(path / OPTIMIZER) and not any(p.is_dir() for p in path.glob("global_step*")):
        return f"{OPTIMIZER} missing or empty"
    if not _nonempty(path / SCHEDULER):
        return f"{SCHEDULER} missing or empty"
    if not any(_nonempty(p) for p in path.glob("rng_state*.pth")):
        return "rng_state.pth missing or empty"
    return ""


def at_end(path: Path) -> bool:
    """Whether the checkpoint is the run's last step (its ``global_step`` reached its ``max_steps``)."""
    state = trainer_state(path)
    if state is None:
        return False
    step, total = state.get("global_step"), state.get("max_steps")
    return isinstance(step, int) and isinstance(total, int) and 0 < total <= step
