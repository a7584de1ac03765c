"""What counts as a killed attempt's half-done write (``trainers.debris``): safetensors' temporary
name exactly, directly in an output directory, written since the run began; nothing else."""

from __future__ import annotations

import os
from pathlib import Path

from trainsup.trainers.debris import write_debris

SINCE = 1_700_000_000.0


def touch(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    os.utime(path, (mtime, mtime))
    return path


def test_only_this_runs_temporary_weights_writes_count(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ours = touch(out / ".tmpAb3dE9", SINCE + 5)
    touch(out / ".tmpOld123", SINCE - 60)  # a user's, from before the run
    touch(out / ".tmpToolong7", SINCE + 5)  # not safetensors' name
    touch(out / ".tmp12345", SINCE + 5)
    touch(out / "tmpAb3dE9", SINCE + 5)
    touch(out / ".final.json.tmp", SINCE + 5)  # trainsup's own atomic writes are named otherwise
    touch(out / "checkpoint-10" / ".tmpXyZ123", SINCE + 5)  # inside a state: the state is incomplete instead
    (out / ".tmpDirABC").mkdir()
    assert write_debris([out, out, tmp_path / "missing"], SINCE) == [ours]
