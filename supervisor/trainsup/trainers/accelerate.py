"""Owns what a state directory written by Hugging Face accelerate's ``Accelerator.save_state`` holds,
and when one is complete: the format sd-scripts, musubi-tuner and the diffusers example scripts
(``out/checkpoint-N/``) share, so every adapter of theirs judges a state the same way.

``save_state`` writes, per prepared object: the model's weights (``model.safetensors``, or
``pytorch_model.bin`` without safe serialization; ``model_1.safetensors`` ... for more models, or
what a registered save hook writes instead, such as diffusers' ``pytorch_lora_weights.safetensors``),
``optimizer.bin``, ``scheduler.bin``, ``scaler.pt`` under fp16 mixed precision, and last, one
``random_states_N.pkl`` per process. Nothing is atomic and there is no completion marker: a state
counts only when every file is there and non-empty and its safetensors header covers the file. No
tensor is loaded and torch is never imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .sthead import HeaderError, load_header

MODEL_FILES = ("model.safetensors", "pytorch_model.bin")  # the first model's weights, either format
OPTIMIZER = "optimizer.bin"
SCHEDULER = "scheduler.bin"
SCALER = "scaler.pt"  # only under fp16 mixed precision (a GradScaler)


def random_states(process: int = 0) -> str:
    """The file one process writes last (process 0's is the last file of a one-process save)."""
    return f"random_states_{process}.pkl"


LAST_FILE = random_states(0)


def required_files(*, model: bool = True, scaler: bool = False, processes: int = 1,
                   first: Sequence[str] = ()) -> tuple[str, ...]:
    """The files a complete state holds, in the order they are written (``first``: the trainer's
    own, written before accelerate's; ``model`` False: a save hook writes the weights instead)."""
    return (*first, *(MODEL_FILES[:1] if model else ()), OPTIMIZER, SCHEDULER,
            *((SCALER,) if scaler else ()), *(random_states(n) for n in range(processes)))


def model_file(state: Path) -> Path:
    """The first model's weights file in ``state`` (``model.safetensors`` when neither exists)."""
    for name in MODEL_FILES:
        if (state / name).is_file():
            return state / name
    return state / MODEL_FILES[0]


def missing_file(state: Path, names: Sequence[str]) -> str:
    """'' when each file is in ``state`` and not empty; else which one is not."""
    for name in names:
        if name == MODEL_FILES[0]:
            name = model_file(state).name  # pytorch_model.bin stands in for it
        f = state / name
        try:
            if f.is_file() and f.stat().st_size > 0:
                continue
        except OSError:
            pass
        return f"{name} missing or empty"
    return ""


def check_safetensors(path: Path) -> str:
    """'' when the file's header parses and covers the file; else why not."""
    try:
        header = load_header(path)
        missing = header.missing_bytes()
    except HeaderError as exc:
        return f"{path.name}: {exc}"
    except OSError as exc:
        return f"{path.name}: unreadable header ({exc})"
    if missing:
        return f"{path.name}: truncated ({header.size} bytes, tensors need {header.size + missing})"
    return _library_check(path)


def _library_check(path: Path) -> str:
    """Also ask the safetensors library, when numpy is there for it (it needs a framework)."""
    try:
        import numpy  # noqa: F401
        from safetensors import safe_open
    except ImportError:
        return ""
    try:
        with safe_open(str(path), framework="numpy") as fh:
            fh.keys()
    except Exception as exc:  # noqa: BLE001 - the library raises its own SafetensorError types
        return f"{path.name}: safetensors refused it ({exc})"
    return ""


def state_problem(state: Path, *, model: bool = True, scaler: bool = False, processes: int = 1) -> str:
    """'' when ``state`` is a complete ``save_state`` directory, else why not: every file there
    and non-empty, and the model's safetensors (when it is one) whole."""
    if not state.is_dir():
        return "not a directory"
    problem = missing_file(state, required_files(model=model, scaler=scaler, processes=processes))
    if problem or not model:
        return problem
    weights = model_file(state)
    return check_safetensors(weights) if weights.suffix == ".safetensors" else ""


def written_at(state: Path) -> float:
    """When the state's last file was written (``inf`` when it is not there: not complete yet)."""
    try:
        return (state / LAST_FILE).stat().st_mtime
    except OSError:
        return float("inf")
