"""The real-diffusers tier: skipped, saying why, unless TRAINSUP_REALDIFFUSERS=1; else the bed is built
(or found built, in about 30 s) by ``../shared/realdiffusers/setup``. Where CI is set, a tier that
cannot run fails instead: a silently skipped tier would be a defect."""

from __future__ import annotations

import pytest

from tests.conftest import ready_bed
from tests.real_diffusers.bed import DiffusersBed, build_bed


@pytest.fixture(scope="session")
def diffusers_bed() -> DiffusersBed:
    return ready_bed(build_bed(), "real-diffusers")
