"""The real ranks tier: two gloo ranks of the Hugging Face Trainer (TRL's ``sft.py`` under ``torchrun``) on
the CPU, on the bed of ``tests/real_hf``: skipped, saying why, unless TRAINSUP_REALHF=1; where CI is set, a
tier that cannot run fails instead."""

from __future__ import annotations

import pytest

from tests.conftest import ready_bed
from tests.real_hf.bed import HfBed, build_bed


@pytest.fixture(scope="session")
def hf_bed() -> HfBed:
    return ready_bed(build_bed(), "real ranks")
