"""Owns what each LitGPT training subcommand is, as read in the installed package (litgpt 0.5.13):
its weights file, whether and how it resumes, how its step folders are named and finished, and the
defaults of the settings the adapter reads when the command leaves them out.

Resume, per method (``litgpt/finetune/*.py``, ``litgpt/pretrain.py``):

- ``finetune_full`` and ``pretrain`` take ``--resume`` as ``bool | "auto" | Path``; a path goes
  straight to ``fabric.load`` (``find_resume_path`` returns it unchanged), ``auto``/``true`` take the
  newest ``step-*/*.pth`` in the out dir without checking it. Resumes are exact: optimizer, LR
  scheduler, ``iter_num`` and ``step_count`` come from the state and the data loader is replayed.
- ``finetune_lora`` (and its alias ``finetune``) and ``finetune_adapter`` have no resume option.
- ``finetune_adapter_v2`` has ``resume: bool``, but it is not a resume: ``load_checkpoint_update``
  merges the saved ``{"model": {...}}`` wrapper into the base state dict as one key named ``model``,
  which ``load_state_dict(strict=False)`` drops, so the adapter weights are not loaded; and
  ``step_count`` starts at 0 when resuming (while a run *without* ``--resume`` into an out dir that
  holds step folders starts counting at the newest folder's step). trainsup treats it as having no
  resume and gives every restart an empty out dir of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ResumeKind = Literal["path", "none"]

# Lightning Fabric 2.6's accepted ``precision`` values (``_PRECISION_INPUT``), as its
# ``Precision '...' is invalid`` error lists them.
VALID_PRECISIONS: tuple[str, ...] = (
    "transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed",
    "32-true", "64-true", "64", "32", "16", "bf16",
)
# The values worth suggesting (the integer/short spellings are legacy aliases).
SUGGESTED_PRECISIONS = ("32-true", "bf16-true", "bf16-mixed", "16-true", "16-mixed", "64-true")


@dataclass(frozen=True)
class Method:
    subcommand: str
    weights: str  # the weights file inside a step folder and final/
    resume: ResumeKind
    step_digits: int  # step-000010 (finetune) or step-00000010 (pretrain)
    # The file a save writes last: its presence means the save got to the end. (The weights come
    # first; finetune_full/pretrain's fabric.save moves a finished temp file into place.)
    marker: str
    default_out: str  # out_dir when the command gives none (relative to the cwd)
    lora: bool = False  # takes --lora_query/--lora_key/--lora_value
    quantize: bool = False  # takes --quantize (bitsandbytes)
    positional: str = "checkpoint_dir"  # what the first positional names
    saving_line: bool = False  # prints "Saving checkpoint to ..." before each save
    why_no_resume: str = ""
    # defaults of the settings the adapter reads (the method's TrainArgs defaults)
    lr_warmup_steps: int = 100
    micro_batch_size: int = 1
    global_batch_size: int = 16
    devices: str = "1"
    save_interval: int = 1000
    num_workers: int = 4  # litgpt's data modules (JSON, Alpaca, ...) default to 4 workers


METHODS: dict[str, Method] = {
    "finetune_lora": Method(
        "finetune_lora", "lit_model.pth.lora", "none", 6, "prompt_style.yaml", "out/finetune/lora",
        lora=True, quantize=True,
        why_no_resume="finetune_lora cannot resume: LitGPT 0.5.13 gives it no resume option (--resume exits 2)"),
    "finetune_full": Method(
        "finetune_full", "lit_model.pth", "path", 6, "prompt_style.yaml", "out/finetune/full", saving_line=True),
    "finetune_adapter": Method(
        "finetune_adapter", "lit_model.pth.adapter", "none", 6, "prompt_style.yaml", "out/finetune/adapter",
        quantize=True, why_no_resume="finetune_adapter cannot resume: LitGPT 0.5.13 gives it no resume option"),
    "finetune_adapter_v2": Method(
        "finetune_adapter_v2", "lit_model.pth.adapter_v2", "none", 6, "prompt_style.yaml",
        "out/finetune/adapter-v2", quantize=True,
        why_no_resume=("finetune_adapter_v2 cannot resume: its --resume in LitGPT 0.5.13 does not load the "
                       "saved adapter weights and restarts its step count at 0")),
    # pretrain: states are `step-%08d/lit_model.pth`; its save writes hyperparameters.yaml, the
    # tokenizer files, then model_config.yaml (save_config) last; no prompt_style.yaml.
    "pretrain": Method(
        "pretrain", "lit_model.pth", "path", 8, "model_config.yaml", "out/pretrain", positional="model_name",
        saving_line=True, lr_warmup_steps=2000, micro_batch_size=4, global_batch_size=512, devices="auto"),
}
METHODS["finetune"] = METHODS["finetune_lora"]  # litgpt's CLI maps `finetune` to finetune_lora

TRAINING_SUBCOMMANDS = frozenset(METHODS)

# Settings LitGPT restores from a saved state rather than from the command line: the LR schedule
# (warmup, its length from max_steps/epochs, the optimizer's learning rates). Changing one takes a
# fresh start; a resume would carry the old schedule on (seen: a corrected warmup crashed again).
SCHEDULE_KEYS = ("train.lr_warmup_steps", "train.lr_warmup_fraction", "train.max_steps", "train.epochs",
                 "train.min_lr")
SCHEDULE_PREFIXES = ("optimizer.",)


def is_schedule_key(key: str) -> bool:
    return key in SCHEDULE_KEYS or key == "optimizer" or key.startswith(SCHEDULE_PREFIXES)
