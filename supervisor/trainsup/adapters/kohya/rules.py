"""Owns the fault rules of sd-scripts' (and musubi-tuner's) own wording, tried before the built-in table.

They reuse built-in ids: ``flag_conflict`` (the assertions sd-scripts makes at start-up about
combinations of its options) and ``config_error`` (its dataset TOML that does not parse, a dataset
with no images, a resume at or past ``--max_train_steps``). The wording is sd-scripts' own, so a
log of any trainer can be read with them: ``FAMILY_RULES`` are what ``diagnose`` tries on an unknown
log, and a run of this adapter uses the same (``RUN_RULES``).
"""

from __future__ import annotations

from ...faults.rules import FaultRule

FAMILY_RULES: tuple[FaultRule, ...] = (
    FaultRule(
        id="flag_conflict",
        patterns=(
            # sd-scripts' assertions (wording varies a little between scripts and versions)
            r"AssertionError: when caching .{0,300}?cannot be used", r" caption_tag_dropout_rate cannot be used",
            r"either color_aug or random_crop cannot be used",
            r"network for Text Encoder cannot be trained with caching",
            r"(?:fp8_base|full_fp16|full_bf16) requires mixed precision", r" blocks_to_swap is not supported with",
            r" fused_backward_pass currently only works with",
        ),
        explanation="The trainer refused a combination of options at start-up.",
    ),
    FaultRule(
        id="config_error",
        patterns=(
            # sd-scripts' and musubi's own line (its Japanese half may be printed as \\uXXXX escapes)
            r"Error on parsing TOML config file",
            r"No data found\. Please verify arguments", r" max_train_steps should be greater than initial step",
        ),
        restartable=False,
        explanation="The command or its configuration is wrong (an argument, a path, a TOML file, a "
        "permission or a missing dataset); a restart cannot fix it.",
    ),
)
RUN_RULES = FAMILY_RULES
