"""diffusers' unmodified example trainer ``train_text_to_image_lora.py`` (diffusers 0.40.0, a LoRA on a
tiny random Stable-Diffusion pipeline, on the CPU) on a test bed, and `trainsup run` over it.

The bed is built by ``../shared/realdiffusers/setup`` (beside this repository) in
``TRAINSUP_REALDIFFUSERS_DIR``, else ``~/.cache/trainsup-realdiffusers``: a venv with diffusers and the
example's requirements, the model, 8 captioned 64 px images (8 steps an epoch at batch 1). Every command
is what a user types: ``accelerate launch .../train_text_to_image_lora.py ...``. A 20-step run takes
about 10-20 s, nearly all of it start-up; ~560 MB of memory.
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT, built_bed, safetensors_max_abs_diff

SETUP = ROOT.parent / "shared" / "realdiffusers" / "setup"
SCRIPT = "train_text_to_image_lora.py"
STEPS_PER_EPOCH = 8  # 8 images, batch 1
# How far a run resumed mid-epoch ends from an uninterrupted one (max |dw| of the final LoRA, 20 steps),
# measured on this bed through trainsup: the script restarts the interrupted epoch with a new data order.
# Resumed from checkpoint-5 (checkpoint-10 cut mid-save): 1.44e-3; from checkpoint-15 (a kill inside the
# save of step 20): 5.12e-4; the bed's README measured 1.19e-3 for a bare `latest` from checkpoint-10.
# From an epoch's end (or the run's start) it is 0. With a little room; the figures stand in docs/measured.md.
RESIDUAL = 2e-3


@dataclass(frozen=True)
class DiffusersBed:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    def command(self, out: Path, *extra: str, steps: int = 20, every: int = 5) -> list[str]:
        """The bed README's command (20 steps, a checkpoint every 5), ``extra`` flags appended."""
        r = self.root
        return [str(r / "venv/bin/accelerate"), "launch", str(r / "diffusers/examples/text_to_image" / SCRIPT),
                "--pretrained_model_name_or_path", str(r / "model/tiny-sd"), "--train_data_dir", str(r / "data/train"),
                "--resolution", "64", "--center_crop", "--random_flip", "--train_batch_size", "1",
                "--max_train_steps", str(steps), "--checkpointing_steps", str(every), "--learning_rate", "1e-04",
                "--lr_scheduler", "constant", "--lr_warmup_steps", "0", "--seed", "42", "--output_dir", str(out),
                *extra]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_")}
        env.update(HF_HOME=str(self.root / "hf-home"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def run_plain(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        """The trainer without trainsup (the uninterrupted reference)."""
        return subprocess.run(argv, cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=600,
                              check=False)

    def max_abs_diff(self, a: Path, b: Path) -> float:
        """The largest difference over every tensor of two safetensors files (the same names in both)."""
        return safetensors_max_abs_diff(a, b)


@functools.cache
def build_bed() -> DiffusersBed | str:
    """The bed, built if needed (about 3 min from scratch, ~30 s when built); or why the tier cannot run
    here. Once per test session."""
    if os.environ.get("TRAINSUP_REALDIFFUSERS") != "1":
        return ("TRAINSUP_REALDIFFUSERS is not 1: set TRAINSUP_REALDIFFUSERS=1 to run the real-diffusers tier "
                f"(it builds or reuses the bed with {SETUP}: 1.6 GB of disk)")
    if not SETUP.is_file():
        return f"no diffusers bed builder at {SETUP} (expected ../shared/realdiffusers/setup beside this repository)"
    where = os.environ.get("TRAINSUP_REALDIFFUSERS_DIR") or str(Path.home() / ".cache" / "trainsup-realdiffusers")
    return DiffusersBed(built_bed(SETUP, where, "diffusers"))
