"""Fixtures of the real-systemd tests: a skip where no sandbox can run, and scratch files outside /tmp."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.system.sandbox import unavailable


@pytest.fixture(scope="module")
def systemd_here() -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)


def _scratch_base() -> Path:
    """Not under /tmp or /var/tmp: the unit's PrivateTmp= would hide the files from the service."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainsup-system-tests"
    if any(base.resolve().is_relative_to(t) for t in ("/tmp", "/var/tmp")):
        base = Path("/var/cache/trainsup-system-tests")
    base.mkdir(parents=True, exist_ok=True)
    return base


@pytest.fixture
def work(systemd_here: None) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="run-", dir=_scratch_base()))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
