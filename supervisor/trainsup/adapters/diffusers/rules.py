"""Owns the fault rules of the diffusers example scripts' own wording, tried before the built-in table
(and by ``diagnose`` on any log).

One fault id is this adapter's alone: ``flag_needs_package``, a memory flag whose package the
trainer's environment lacks (a command copied from a GPU box): ``--enable_xformers_memory_efficient_attention``
without xformers (``ValueError: xformers is not available. Make sure it is installed correctly``, seen
on the real bed) and ``--use_8bit_adam`` without bitsandbytes. The script refuses it at start-up, before
a step; the remedy drops the flag (``remedies``).
"""

from __future__ import annotations

from ...faults.rules import FaultRule

FLAG_NEEDS_PACKAGE = "flag_needs_package"

FAMILY_RULES: tuple[FaultRule, ...] = (
    FaultRule(
        id=FLAG_NEEDS_PACKAGE,
        patterns=(
            r"xformers is not available\. Make sure it is installed correctly",
            r"Please install bitsandbytes to use 8-bit Adam",
        ),
        explanation="A flag of the command needs a package the trainer's environment lacks (xformers for "
        "--enable_xformers_memory_efficient_attention, bitsandbytes for --use_8bit_adam).",
    ),
)
