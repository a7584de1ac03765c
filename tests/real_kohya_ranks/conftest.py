"""The real sd-scripts ranks tier: two gloo ranks of ``train_textual_inversion.py`` under ``accelerate launch
--multi_gpu --num_processes 2`` on the CPU, on the bed of ``tests/real`` (``../shared/realkohya``): skipped,
saying why, unless TRAINSUP_SD_SCRIPTS is set; where CI is set, a tier that cannot run fails instead."""

from __future__ import annotations

import pytest

from tests.conftest import ready_bed
from tests.real.bed import Bed, build_bed


@pytest.fixture(scope="session")
def kohya_bed() -> Bed:
    return ready_bed(build_bed(), "real sd-scripts ranks")
