"""The real sd-scripts SDXL tier: skipped, saying why, unless TRAINSUP_REALSDXL=1; else the bed is built (or
found built, in seconds) by ``tests/real_sdxl/setup``. Where CI is set, a tier that cannot run fails instead:
a silently skipped tier would be a defect."""

from __future__ import annotations

import os

import pytest

from tests.real_sdxl.bed import SdxlBed, build_bed


@pytest.fixture(scope="session")
def sdxl_bed() -> SdxlBed:
    found = build_bed()
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the real sd-scripts SDXL tier cannot run: {found}")
        pytest.skip(found)
    return found
