"""The real Hugging Face Trainer tier (TRL's ``trl sft``): skipped, saying why, unless TRAINSUP_REALHF=1;
else the bed is built (or found built, in about 30 s) by ``../shared/realhf/setup``. Where CI is set, a
tier that cannot run fails instead: a silently skipped tier would be a defect."""

from __future__ import annotations

import os

import pytest

from tests.real_hf.bed import HfBed, build_bed


@pytest.fixture(scope="session")
def hf_bed() -> HfBed:
    found = build_bed()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the real Hugging Face Trainer tier cannot run: {found}")
        pytest.skip(found)
    return found
