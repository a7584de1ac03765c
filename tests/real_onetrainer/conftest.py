"""The real-OneTrainer tier: skipped, saying why, unless TRAINSUP_REALONETRAINER=1; else the bed is
built (or found built, in about 20 s) by ``../shared/realonetrainer/setup``."""

from __future__ import annotations

import pytest

from tests.real_onetrainer.bed import OTBed, build_bed


@pytest.fixture(scope="session")
def ot_bed() -> OTBed:
    found = build_bed()
    if isinstance(found, str):
        pytest.skip(found)
    return found
