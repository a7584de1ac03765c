"""Live inputs and remedies on the real sd-scripts train_network.py.

A sample-prompt file caught half-written is rejected and never reaches the trainer (real kohya
re-reads the file at every sampling and would crash on a half TOML). A remedy that removes a key
through derived copies of the user's --config_file / --dataset_config is sd-scripts' remedy case in
the behaviour suite (tests/behaviour/beds.py, KohyaBed).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.demo_harness import supervise
from tests.real.bed import Bed
from tests.real.test_real_runs import POLICY

TOML_HEAD = "[prompt]\nwidth = 64\nheight = 64\nsample_steps = 2\nseed = {seed}\n\n[[prompt.subset]]\n"
PROMPT_FILES = {
    ".txt": ("a red cube --w 64 --h 64 --s 2 --d 1\n",
             "a blue sphere on a table --w 64 --h",  # cut off mid-option: --h has no value yet
             "a blue sphere on a table --w 64 --h 64 --s 2 --d 3\n"),
    ".toml": (TOML_HEAD.format(seed=1) + 'prompt = "a red cube"\n',
              TOML_HEAD.format(seed=3) + 'prompt = "a blue sph',  # cut off inside a string
              TOML_HEAD.format(seed=3) + 'prompt = "a blue sphere on a table"\n'),
}


def sampled_prompts(log: Path) -> list[str]:
    """The prompts real kohya logged as it generated samples (`prompt: ...`)."""
    text = log.read_text(encoding="utf-8", errors="replace")
    return [m.group(1).strip() for m in re.finditer(r"INFO\s+prompt: (.*?)\s{2,}\S+\.py:\d+", text)]


@pytest.mark.parametrize("suffix", [".txt", ".toml"])
def test_a_half_written_prompt_file_never_reaches_the_trainer(bed: Bed, tmp_path: Path, suffix: str) -> None:
    original, half, full = PROMPT_FILES[suffix]
    prompts = tmp_path / f"prompts{suffix}"
    prompts.write_text(original, encoding="utf-8")
    out = tmp_path / "out"
    edits: list[str] = []

    def edit_after_first_state(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and not edits:
            prompts.write_text(half, encoding="utf-8")  # an editor's save caught half-way
            edits.append("half")
            time.sleep(1.5)  # well past the watcher's debounce: the half file is seen on its own
            prompts.write_text(full, encoding="utf-8")
            edits.append("full")

    argv = bed.command(out, "--sample_prompts", str(prompts), "--sample_every_n_steps", "5", steps=15)
    run = supervise(argv, out, tmp_path, env=bed.env(), policy=POLICY, on_event=edit_after_first_state,
                    timeout=900, cwd=bed.sd_scripts)
    assert run.returncode == 0, run.stderr[-3000:]
    assert edits == ["half", "full"] and not run.of("fault")
    rejected = run.of("change_rejected")
    assert len(rejected) == 1 and rejected[0]["path"] == str(prompts)
    assert [e["path"] for e in run.of("change_applied")] == [str(prompts)]
    seen = sampled_prompts(run.run_dir / "attempt-1.log")
    assert seen[0] == "a red cube" and seen[-1] == "a blue sphere on a table", seen
    assert set(seen) == {"a red cube", "a blue sphere on a table"}  # nothing half-written was sampled
    assert prompts.read_text(encoding="utf-8") == full  # the user's file is theirs
    assert len(list((out / "sample").glob("*.png"))) == len(seen)
