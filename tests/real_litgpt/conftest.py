"""The real-LitGPT tier: skipped, saying why, unless TRAINSUP_REALLITGPT=1; else the bed is built (or
found built, in about 20 s) by ``../shared/reallitgpt/setup``."""

from __future__ import annotations

import pytest

from tests.real_litgpt.bed import LitBed, build_bed


@pytest.fixture(scope="session")
def litgpt_bed() -> LitBed:
    found = build_bed()
    if isinstance(found, str):
        pytest.skip(found)
    return found
