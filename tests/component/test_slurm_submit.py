"""A real Slurm (``../shared/tools/slurm-sandbox``: Debian's slurmctld, slurmd and munged, state under a
temporary directory, always stopped) takes the script ``trainsup slurm`` writes: ``sbatch
--test-only`` accepts it, and ``--submit`` of a project that ends at once gives a COMPLETED job, exit
0, whose log is in the run dir. Skipped, with the reason, only when the sandbox cannot start here.
The deadline signal, requeue and the rest of issue 23's Slurm behaviour are ``tests/slurm/``'s."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

SANDBOX = ROOT.parent / "shared" / "tools" / "slurm-sandbox"
TRAINSUP = Path(sys.executable).parent / "trainsup"


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[dict[str, str]]:
    if not SANDBOX.is_file():
        pytest.skip(f"no Slurm sandbox at {SANDBOX}")
    if shutil.which("slurmctld", path="/usr/sbin:/usr/bin") is None:
        pytest.skip("Slurm is not installed (`slurm-sandbox install`)")
    where = tmp_path / "sandbox"
    try:
        started = subprocess.run(["bash", str(SANDBOX), "start", str(where)], capture_output=True, text=True,
                                 timeout=120, check=False)
        if started.returncode != 0:
            pytest.skip(f"the Slurm sandbox cannot start here: {started.stderr.strip()[-500:]}")
        yield {**os.environ, "SLURM_CONF": started.stdout.strip().rpartition("SLURM_CONF=")[2]}
    finally:
        subprocess.run(["bash", str(SANDBOX), "stop", str(where)], capture_output=True, timeout=120, check=False)


def test_slurm_runs_the_script_trainsup_writes(slurm: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "hello.yaml"
    project.write_text("command: [python3, -c, \"print('hello from the job')\"]\nrun_dir: runs/hello\n",
                       encoding="utf-8")
    script = tmp_path / "hello.sbatch"
    wrote = subprocess.run([str(TRAINSUP), "slurm", str(project), "--output-script", str(script), "--singleton",
                            "--time=00:02:00", "-p", "debug"], capture_output=True, text=True, env=slurm,
                           timeout=60, check=False)
    assert wrote.returncode == 0, wrote.stderr
    tested = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, env=slurm,
                            cwd=tmp_path, timeout=60, check=False)
    assert tested.returncode == 0 and "to start at" in tested.stderr, tested.stderr

    submitted = subprocess.run([str(TRAINSUP), "slurm", str(project), "--output-script", str(script),
                                "--singleton", "--time=00:02:00", "-p", "debug", "--submit"],
                               capture_output=True, text=True, env=slurm, cwd=tmp_path, timeout=60, check=False)
    assert submitted.returncode == 0, submitted.stderr
    found = re.search(r"Submitted batch job (\d+)", submitted.stdout)
    assert found, submitted.stdout
    job = found.group(1)
    deadline = time.monotonic() + 60
    state = ""
    while time.monotonic() < deadline:
        state = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=slurm,
                               timeout=30, check=False).stdout
        if re.search(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT)", state):
            break
        time.sleep(0.5)
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state
    assert "JobName=hello" in state and "Requeue=1" in state
    log = tmp_path / "runs" / "hello" / f"slurm-{job}.out"
    text = log.read_text(encoding="utf-8")
    assert "hello from the job" in text and "trainsup: training finished" in text
