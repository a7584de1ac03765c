"""The real ranks tier: two gloo ranks of the Hugging Face Trainer (TRL's ``sft.py`` under ``torchrun``) on
the CPU, on the bed of ``tests/real_hf``: skipped, saying why, unless TRAINSUP_REALHF=1; where CI is set, a
tier that cannot run fails instead."""

from __future__ import annotations

import os

import pytest

from tests.real_hf.bed import HfBed, build_bed


@pytest.fixture(scope="session")
def hf_bed() -> HfBed:
    found = build_bed()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the real ranks tier cannot run: {found}")
        pytest.skip(found)
    return found
