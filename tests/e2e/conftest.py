from __future__ import annotations

from pathlib import Path

import pytest

from trainsup.demo.make_assets import make_assets


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_assets(tmp_path_factory.mktemp("assets"))
