"""The real-trainer tier: skips, saying why, when TRAINSUP_SD_SCRIPTS is unset; else builds the bed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.real.bed import Bed, build_bed

BNB_WARNING = Path(__file__).resolve().parent / "bnb_warning"


@pytest.fixture(scope="session")
def bed() -> Bed:
    found = build_bed()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture
def bnb_env(bed: Bed) -> dict[str, str]:
    """The bed's environment with bitsandbytes' AVX512-BF16 warning as the trainer's first line."""
    inherited = os.environ.get("PYTHONPATH")
    return bed.env(PYTHONPATH=os.pathsep.join(p for p in (str(BNB_WARNING), inherited) if p))
