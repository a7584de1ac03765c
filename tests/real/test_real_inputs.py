"""Live inputs and remedies on the real sd-scripts train_network.py.

A sample-prompt file caught half-written is rejected and never reaches the trainer (real kohya
re-reads the file at every sampling and would crash on a half TOML); a remedy that removes a key
does so through derived copies of the user's --config_file / --dataset_config, which the trainer
then reads and trains with.
"""

from __future__ import annotations

import re
import time
import tomllib
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


def test_a_remedy_removes_a_key_from_the_users_config_file_and_dataset_config(bed: Bed, tmp_path: Path) -> None:
    # cache_latents in the --config_file and random_crop in the --dataset_config: real sd-scripts
    # refuses the pair ("when caching latents, either color_aug or random_crop cannot be used").
    # trainsup drops the caching, never the augmentation: from a derived copy of each file.
    config = tmp_path / "config.toml"
    config.write_text("# speed\n[caching]\ncache_latents = true  # latents in memory\n", encoding="utf-8")
    dataset = tmp_path / "dataset.toml"
    user_dataset = (bed.root / "data" / "dataset.toml").read_text(encoding="utf-8")
    dataset.write_text(user_dataset.replace("[general]\n", "[general]\nrandom_crop = true\n"), encoding="utf-8")
    assert "random_crop = true" in dataset.read_text(encoding="utf-8")
    before = {p: p.read_bytes() for p in (config, dataset)}
    out = tmp_path / "out"
    argv = bed.command(out, "--config_file", str(config), "--cache_latents_to_disk", dataset=dataset, steps=10)
    run = supervise(argv, out, tmp_path, env=bed.env(), policy=POLICY, timeout=900, cwd=bed.sd_scripts)
    assert run.returncode == 0, run.stderr[-3000:]
    fault = run.of("fault")[0]
    assert fault["class"] == "flag_conflict" and "when caching latents" in fault["evidence"]
    actions = run.of("remedy")[0]["actions"]
    assert any("remove --cache_latents" in a and str(config) in a for a in actions), actions
    argv2 = run.of("attempt_start")[-1]["argv"]
    assert "--cache_latents_to_disk" not in argv2
    script_args = argv2[argv2.index("train_network.py"):]  # accelerate has a --config_file of its own
    assert argv2[argv2.index("--config_file") + 1] == str(bed.root / "accel.yaml")
    derived_config = Path(script_args[script_args.index("--config_file") + 1])
    derived_dataset = Path(script_args[script_args.index("--dataset_config") + 1])
    assert derived_config.parent == derived_dataset.parent == run.run_dir / "derived"
    assert "cache_latents" not in tomllib.loads(derived_config.read_text())["caching"]
    assert "# speed" in derived_config.read_text()  # the user's comments travel with the copy
    assert tomllib.loads(derived_dataset.read_text())["general"]["random_crop"] is True
    assert {p: p.read_bytes() for p in (config, dataset)} == before  # the user's files are untouched
    assert (out / "tiny.safetensors").is_file() and not list(bed.root.joinpath("data/images").glob("*.npz"))
    # The copies are what the trainer read: its log names them.
    log = (run.run_dir / "attempt-2.log").read_text(encoding="utf-8", errors="replace")
    assert f"Loading dataset config from {derived_dataset}" in log
