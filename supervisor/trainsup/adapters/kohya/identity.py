"""Owns what makes an sd-scripts (or musubi-tuner) run this run: the fields of its identity
(``record.identity``) read from the user's command and the files it names, and the weights and
states already lying under its output name.

Only what shapes the weights counts, as the user gave it: the script, the base model, the images
(their names, not the captions: a caption edit is a live edit of the same run), the network, the
optimizer and learning rates, the resolution, the seed, the steps and the output name. Flags trainsup
adds (a seed, a save cadence) and remedies (caching dropped, the batch halved) never change it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...record.identity import files_summary
from . import tomlio
from .plan import LaunchPlan
from .profile import state_dir_names, weights_files_for
from .states import state_dirs

SHAPING = ("pretrained_model_name_or_path", "network_module", "network_dim", "network_alpha", "network_args",
           "network_weights", "optimizer_type", "optimizer_args", "learning_rate", "unet_lr", "text_encoder_lr",
           "lr_scheduler", "resolution", "max_train_steps", "max_train_epochs", "train_batch_size",
           "gradient_accumulation_steps", "seed", "output_name", "network_train_unet_only",
           "network_train_text_encoder_only", "v2", "v_parameterization")


def _resolve(value: object | None, cwd: Path) -> Path | None:
    if value is None or value == "":
        return None
    p = Path(str(value)).expanduser()
    return p if p.is_absolute() else cwd / p


def image_dirs(plan: LaunchPlan, cwd: Path) -> list[Path]:
    """The folders of images the run trains on: the dataset config's subsets, else ``--train_data_dir``."""
    dataset = _resolve(plan.value("dataset_config"), cwd)
    if dataset is not None:
        try:
            doc = tomlio.read_toml(dataset)
        except (tomlio.ConfigFileError, OSError):
            return [dataset]
        dirs = [_resolve(sub.get("image_dir"), cwd) for ds in doc.get("datasets", []) or []
                for sub in ds.get("subsets", []) or [] if isinstance(sub, dict)]
        return [d for d in dirs if d is not None] or [dataset]
    data = _resolve(plan.value("train_data_dir"), cwd)
    return [data] if data is not None else []


def identity_fields(script: str, plan: LaunchPlan, cwd: Path, output_dir: Path | None,
                    dirs: list[Path] | None = None, shaping: tuple[str, ...] = SHAPING) -> dict[str, Any]:
    """The identity of the run ``plan`` (the user's command, before trainsup adds anything) describes;
    ``dirs``: the image folders, where the trainer's dataset config names them otherwise (musubi)."""
    fields: dict[str, Any] = {"trainer": plan.dialect.trainer, "script": script,
                              "output_dir": str(output_dir) if output_dir else None}
    for key in shaping:
        value = plan.value(key)
        if key in ("pretrained_model_name_or_path", "dit") and value is not None:
            value = str(_resolve(value, cwd))
        fields[key] = None if value is None else str(value)
    fields["dataset"] = files_summary(image_dirs(plan, cwd) if dirs is None else dirs)
    return fields


def outputs_under(output_dir: Path, output_name: str | None) -> list[Path]:
    """The weights files and state dirs in ``output_dir`` that carry this output name."""
    step, epoch, final = state_dir_names(output_name)
    weights = weights_files_for(output_name)
    try:
        files = [e for e in output_dir.iterdir() if weights.match(e.name)]
    except OSError:
        return []
    return sorted(files + state_dirs(output_dir, {step, epoch, final[: -len("-state")]}))
