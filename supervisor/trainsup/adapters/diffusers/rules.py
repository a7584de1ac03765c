"""Owns the fault rules of the diffusers example scripts' own wording, tried before the built-in table
(and by ``diagnose`` on any log).

It reuses the built-in ``flag_conflict`` (a start-up refusal of the command's options) for a memory flag
whose package the trainer's environment lacks, as a command copied from a GPU box has:
``--enable_xformers_memory_efficient_attention`` without xformers (``ValueError: xformers is not
available. Make sure it is installed correctly``, seen on the real bed) and ``--use_8bit_adam`` without
bitsandbytes. The script refuses it before a step; the remedy drops that flag (``remedies``). Not
``missing_dependency``: that one no restart fixes, and here one without the flag does.
"""

from __future__ import annotations

from ...faults.rules import FaultRule

FLAG_NEEDS_PACKAGE = "flag_conflict"  # a flag its package missing: see the module doc

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
