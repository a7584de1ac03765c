"""Placeholder: the LitGPT adapter is being written."""

from __future__ import annotations

from collections.abc import Sequence

from ..base import Setup, TrainerRun, UsageError


class LitgptFamily:
    name = "litgpt"
    description = "LitGPT (not yet)"

    def detect(self, argv: Sequence[str]) -> int:
        return 0

    def open(self, setup: Setup) -> TrainerRun:
        raise UsageError("the LitGPT adapter is not written yet")


FAMILY = LitgptFamily()
