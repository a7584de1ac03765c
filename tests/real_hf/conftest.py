"""The real Hugging Face Trainer tier (TRL's ``trl sft``): skipped, saying why, unless TRAINSUP_REALHF=1;
else the bed is built (or found built, in about 30 s) by ``../shared/realhf/setup``. Where CI is set, a
tier that cannot run fails instead: a silently skipped tier would be a defect."""

from __future__ import annotations

import pytest

from tests.conftest import ready_bed
from tests.real_hf.bed import HfBed, build_bed


@pytest.fixture(scope="session")
def hf_bed() -> HfBed:
    return ready_bed(build_bed(), "real Hugging Face Trainer")
