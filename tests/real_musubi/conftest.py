"""The real-musubi-tuner tier: skipped, saying why, unless TRAINSUP_REALMUSUBI=1; else the bed is built
(or found built, in about 10 s) by ``../shared/realmusubi/setup``."""

from __future__ import annotations

import pytest

from tests.real_musubi.bed import MusubiBed, build_bed


@pytest.fixture(scope="session")
def musubi_bed() -> MusubiBed:
    found = build_bed()
    if isinstance(found, str):
        pytest.skip(found)
    return found
