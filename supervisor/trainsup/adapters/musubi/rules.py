"""Owns the fault rules of musubi-tuner's own wording, tried before the built-in table (and by
``diagnose`` on any log): its start-up refusals that no restart can fix. sd-scripts' rules
(``kohya.rules``) read the wording the two share (the dataset TOML that does not parse).
"""

from __future__ import annotations

from ...faults.rules import FaultRule
from ..kohya.rules import FAMILY_RULES as KOHYA_RULES

FAMILY_RULES: tuple[FaultRule, ...] = (
    FaultRule(
        id="config_error",
        patterns=(
            # its dataset has no cache files: the caching scripts were never run for this config
            r"No training items found in the dataset",
            # no attention flag: it refuses to load the DiT
            r"either --sdpa, --flash-attn,",
            # --output_name left out: the final save adds None to a string
            r"get_last_ckpt_name|unsupported operand type\(s\) for \+: 'NoneType' and 'str'",
        ),
        restartable=False,
        explanation="musubi-tuner refused its command or dataset (no latent caches, no attention flag, "
        "no --output_name); a restart cannot fix it.",
    ),
)
RUN_RULES = (*FAMILY_RULES, *KOHYA_RULES)
