"""Owns the remedy ladders in OneTrainer's terms and carrying out one action on a OneTrainer plan.

Every change is a config key (dotted for nested objects) that goes into the attempt's derived copy
of the config. A rung of another trainer's ladder (a kohya flag) means nothing here: ``apply``
answers None and the engine skips the rung.

- ``device_mismatch``: ``latent_caching: false``, then ``temp_device`` = ``train_device``, then
  ``validation: false``.
- ``cuda_oom``: gradient checkpointing of the denoiser (unet/transformer/prior), then half the
  ``batch_size`` with twice the ``gradient_accumulation_steps`` (the optimizer sees the same batch),
  then layer offloading (``activation_offloading``, ``offload_fraction`` 0.5), then ``FLOAT_8``
  denoiser weights on the model types OneTrainer quantizes (not SD 1.x/2.x).
- ``nan_loss``: ``learning_rate`` / 10, resumed from a backup saved *before* the newest one of the
  attempt that hit the NaN (the bed: the backup right before the NaN already held blown-up weights).
- ``optimizer_backend``: ``optimizer.optimizer: ADAMW``; ``output_format``: ``KOHYA_LORA``.
"""

from __future__ import annotations

import json
import re

from ...faults import remedies
from ...faults.remedies import Action, Rung, stop
from ...faults.verdict import Said
from ...trainers.base import apply_env, restart_with_same_settings
from .plan import OTPlan
from .rules import OPTIMIZER_BACKEND, OUTPUT_FORMAT

LR = "learning_rate"
DENOISERS = ("unet", "transformer", "prior")
NO_FLOAT8 = re.compile(r"^STABLE_DIFFUSION_(?:15|20|21)")

LADDERS: dict[str, tuple[Rung, ...]] = {
    "device_mismatch": (
        Rung((Action("add_flag", "latent_caching", "false"),)),
        Rung((Action("add_flag", "temp_device", "train_device"),)),
        Rung((Action("add_flag", "validation", "false"),)),
        stop("tensors are still on two devices with latent caching and validation off and temp_device = "
             "train_device; check train_device and the model's per-part weight dtypes"),
    ),
    "cuda_oom": (
        Rung((Action("add_flag", "gradient_checkpointing", "true"),)),
        Rung((Action("halve_batch"),)),
        Rung((Action("add_flag", "offload_fraction", "0.5"),)),
        Rung((Action("add_flag", "weight_dtype", "FLOAT_8"),)),
        stop("out of GPU memory after every memory remedy (gradient checkpointing, batch size 1, layer "
             "offloading, float8 weights where the model takes them)"),
    ),
    "nan_loss": (
        Rung((Action("add_flag", LR, "/10"),)),
        Rung((Action("add_flag", LR, "/10"),)),
        stop("the loss became NaN again with the learning rate lowered twice, resumed from backups saved "
             "before it ran away; check the learning rate, the data and the precision"),
    ),
    OPTIMIZER_BACKEND: (
        Rung((Action("add_flag", "optimizer.optimizer", "ADAMW"),)),
        stop("the optimizer still needs a missing module with optimizer.optimizer ADAMW"),
    ),
    OUTPUT_FORMAT: (
        Rung((Action("add_flag", "output_model_format", "KOHYA_LORA"),)),
        stop("OneTrainer still cannot write the LoRA with output_model_format KOHYA_LORA"),
    ),
}


def ladder(fault: str, plan: OTPlan) -> tuple[Rung, ...]:
    if fault == "config_error":
        return (stop(config_error_reason(plan)),)
    return remedies.ladder(fault, LADDERS)  # else the neutral default


def config_error_reason(plan: OTPlan) -> str:
    """Why a restart cannot help, naming the key to fix when the files tell."""
    if plan.doc and plan.value("__version") is None:
        return f'{plan.config_path} has no "__version" key; add "__version": 11 (OneTrainer otherwise migrates ' \
               "it as a version-0 config and fails in __migration_9)"
    for key, inline in (("concept_file_name", "concepts"), ("sample_definition_file_name", "samples")):
        path = plan.path(key)
        if path is None:
            continue
        try:
            json.loads(path.read_bytes())
        except FileNotFoundError:
            return f"{key} {path} does not exist; fix the key or inline \"{inline}\""
        except (OSError, ValueError) as exc:
            return f"{key} {path} is not valid JSON ({exc}); fix the file or inline \"{inline}\""
    return "the command or its files are wrong; a restart cannot fix it"


def apply_action(plan: OTPlan, action: Action, evidence: Said, nan_backup: int | None) -> str | None:
    """Apply one action; what changed in words, or None when it means nothing here. ``nan_backup``:
    after a NaN, resume only from a backup below this step (the newest backup the failing attempt
    wrote, else the backup it resumed from, else 0: from the beginning)."""
    if action.kind == "set_env":
        return apply_env(plan, action)
    if action.kind == "halve_batch":
        return _halve_batch(plan)
    if action.kind == "add_flag":
        if action.name == LR:
            return _lower_lr(plan, nan_backup)
        if action.name == "temp_device":
            train = str(plan.value("train_device") or "cuda")
            return _set(plan, "temp_device", train, "cpu")
        if action.name in ("latent_caching", "validation"):
            return _set(plan, action.name, False, action.name == "latent_caching")
        if action.name in ("optimizer.optimizer", "output_model_format"):
            return _set(plan, action.name, action.value, None)
        if action.name == "gradient_checkpointing":
            return _per_part(plan, {"gradient_checkpointing": True})
        if action.name == "offload_fraction":
            return _per_part(plan, {"gradient_checkpointing": True, "activation_offloading": True,
                                    "offload_fraction": 0.5})
        if action.name == "weight_dtype":
            if NO_FLOAT8.match(str(plan.value("model_type") or "STABLE_DIFFUSION_15")):
                return None
            return _per_part(plan, {"weight_dtype": "FLOAT_8"})
        return None  # another trainer's flag
    if action.kind == "remove_flag":
        return None
    return restart_with_same_settings(action)


def _same(a: object, b: object) -> bool:
    return str(a).lower() == str(b).lower()


def _set(plan: OTPlan, key: str, value: object, default: object) -> str | None:
    current = plan.value(key, default)
    if current is not None and _same(current, value):
        return None
    plan.set(key, value)
    shown = str(value).lower() if isinstance(value, bool) else value
    return f"{key}: {shown} (was {current if current is not None else 'unset'})"


def denoisers(plan: OTPlan) -> list[str]:
    """The config's denoiser parts (unet, transformer, prior), or the model type's."""
    present = [p for p in DENOISERS if isinstance(plan.doc.get(p), dict)]
    if present:
        return present
    model = str(plan.value("model_type") or "STABLE_DIFFUSION_15")
    if model.startswith("STABLE_DIFFUSION_") and not model.startswith("STABLE_DIFFUSION_3"):
        return ["unet"]
    return ["prior"] if model in ("WUERSTCHEN_2", "STABLE_CASCADE_1") else ["transformer"]


def _per_part(plan: OTPlan, values: dict[str, object]) -> str | None:
    changed: list[str] = []
    for part in denoisers(plan):
        for key, value in values.items():
            full = f"{part}.{key}"
            current = plan.value(full)
            if current is not None and _same(current, value):
                continue
            if key == "offload_fraction" and isinstance(current, (int, float)) and current >= 0.5:
                continue
            plan.set(full, value)
            changed.append(f"{full}: {str(value).lower() if isinstance(value, bool) else value}")
    return ", ".join(changed) or None


def _halve_batch(plan: OTPlan) -> str | None:
    batch = plan.get_int("batch_size", 1) or 1
    if batch <= 1:
        return None
    accum = plan.get_int("gradient_accumulation_steps", 1) or 1
    plan.set("batch_size", batch // 2)
    plan.set("gradient_accumulation_steps", accum * 2)
    return f"batch_size: {batch // 2} (was {batch}), gradient_accumulation_steps: {accum * 2} (was {accum})"


def _lower_lr(plan: OTPlan, nan_backup: int | None) -> str | None:
    lr = plan.get_float(LR, 3e-4)
    if lr is None or lr <= 0:
        return None
    new = float(f"{lr / 10:.3g}")
    plan.set(LR, new)
    where = "from the newest backup"
    if nan_backup is not None:
        plan.resume_below = nan_backup if plan.resume_below is None else min(plan.resume_below, nan_backup)
        where = f"from a backup before step {plan.resume_below} (the newest may hold blown-up weights), " \
                "or from the beginning when there is none"
    return f"{LR}: {new:g} (was {lr:g}), resumed {where}"
