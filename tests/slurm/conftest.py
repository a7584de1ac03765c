"""The real Slurm tier: one throw-away one-node cluster (``../shared/tools/slurm-sandbox``: Debian's
slurmctld, slurmd and munged, state under a temporary directory) for the whole module, always stopped
in a finally. Skipped, with the reason, only when the sandbox cannot start here."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainsup.demo.make_assets import make_assets

SANDBOX = ROOT.parent / "shared" / "tools" / "slurm-sandbox"


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment a Slurm client needs (``SLURM_CONF``) for a running sandbox."""
    if not SANDBOX.is_file():
        pytest.skip(f"no Slurm sandbox at {SANDBOX}")
    if shutil.which("slurmctld", path="/usr/sbin:/usr/bin") is None:
        pytest.skip("Slurm is not installed (run `slurm-sandbox install`, as .ci/run does)")
    where = tmp_path_factory.mktemp("slurm")
    try:
        started = subprocess.run(["bash", str(SANDBOX), "start", str(where)], capture_output=True, text=True,
                                 timeout=120, check=False)
        if started.returncode != 0:
            pytest.skip(f"the Slurm sandbox cannot start here: {started.stderr.strip()[-500:]}")
        conf = started.stdout.strip().rpartition("SLURM_CONF=")[2]
        yield {**os.environ, "SLURM_CONF": conf}
    finally:
        subprocess.run(["bash", str(SANDBOX), "stop", str(where)], capture_output=True, timeout=120, check=False)
