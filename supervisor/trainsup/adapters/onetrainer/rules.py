"""Owns the fault rules of OneTrainer's own wording, tried before the built-in table.

Two ids are OneTrainer's alone: ``optimizer_backend`` (an 8-bit optimizer chosen where bitsandbytes
is not installed: ``No module named 'bitsandbytes'`` raised in ``create_optimizer``) and
``output_format`` (``Unsupported LoRA output format`` when the final model is saved). The others
reuse built-in ids: ``nan_loss`` (OneTrainer stops itself with ``Training loss became NaN``) and
``config_error`` (the start-up failures the bed's README lists: a config without ``__version``, a
missing concept file, a sample file that is not JSON, a LoRA rank other than the backup's).
``device_mismatch`` and ``cuda_oom`` are the built-in rules' wording; only the ladders differ.
"""

from __future__ import annotations

from ...faults.rules import FaultRule

OPTIMIZER_BACKEND = "optimizer_backend"
OUTPUT_FORMAT = "output_format"

RULES: tuple[FaultRule, ...] = (
    FaultRule(
        id=OPTIMIZER_BACKEND,
        patterns=(r"No module named 'bitsandbytes'",),
        frames_require=(r"^create\.py create_optimizer$",),
        explanation="An 8-bit optimizer (optimizer.optimizer *_8BIT) needs bitsandbytes, which this "
        "environment lacks (a CPU install has none); OneTrainer's plain ADAMW needs nothing extra.",
    ),
    FaultRule(
        id=OUTPUT_FORMAT,
        patterns=(r"Unsupported LoRA output format",),
        # cut before the exception line: the saver's raise line quotes the wording
        cut_frames=(r"^LoRASaverMixin\.py _save$",),
        cut_hints=(r"Unsupported LoRA output format",),
        explanation="output_model_format is one OneTrainer cannot write a LoRA in (SAFETENSORS, its "
        "default, is for full models); KOHYA_LORA is the common LoRA file.",
    ),
    FaultRule(
        id="nan_loss",
        patterns=(r"Training loss became NaN",),
        explanation="OneTrainer stopped: the training loss became NaN. The newest backup may already hold "
        "blown-up weights; a lower learning_rate from an earlier backup is the fix.",
    ),
    FaultRule(
        id="config_error",
        patterns=(r"KeyError: 'weight_dtype'",),
        frames_require=(r"^TrainConfig\.py __migration_9$",),
        restartable=False,
        explanation="The config has no \"__version\" key: OneTrainer migrates it as a version-0 config and "
        "fails. Add \"__version\" (11 at the tested commit).",
    ),
    FaultRule(
        id="config_error",
        patterns=(r"JSONDecodeError",),
        # a backup's meta.json cut short is not the user's config (its loader is _load_internal_data)
        frames_exclude=(r" _load_internal_data$",),
        restartable=False,
        explanation="A JSON file the config names (concepts or samples, read at start even with sampling "
        "off) is not valid JSON.",
    ),
    FaultRule(
        id="config_error",
        patterns=(r"size mismatch for lora_(?:down|up)\.weight",),
        restartable=False,
        explanation="The LoRA rank differs from the backup's: a resume must keep the backup's lora_rank.",
    ),
)

# FileNotFoundError and JSONDecodeError are the built-in config_error's wording (restart cannot fix
# them); the ladder names the concept or sample file the config points at.
FAMILY_RULES = RULES
