"""The real kohya-ss/sd-scripts SDXL LoRA trainer (``sdxl_train_network.py``, the snapshot in
``../shared/realkohya/sd-scripts``, on the CPU) on a test bed, and `trainsup run` over it.

The bed is built by ``tests/real_sdxl/setup`` in ``TRAINSUP_REALSDXL_DIR``, else ``~/.cache/trainsup-realsdxl``:
a copy of the snapshot, the SD1.5 bed's venv (sd-scripts' pinned requirements), a random-weight SDXL of the
real layout (the full 2.57B-parameter U-Net in bf16, two narrow text encoders of the widths it needs, a tiny
VAE), the two CLIP tokenizers offline, 4 captioned 64 px images (4 steps an epoch at batch 1) and a prompt
file. Every command is what a user types from ``BED/sd-scripts``: ``accelerate launch ... sdxl_train_network.py
...`` with ``--mixed_precision bf16 --full_bf16 --network_train_unet_only``: 6.4 GB of memory at its peak,
about 45 s from launch to the first step, a few seconds a step once warm, on two idle cores. One such
trainer at a time.
"""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT, built_bed, script_process

SETUP = Path(__file__).resolve().parent / "setup"
SCRIPT = "sdxl_train_network.py"
STEPS_PER_EPOCH = 4  # 4 images, batch 1, 1 repeat


@dataclass(frozen=True)
class SdxlBed:
    root: Path

    @property
    def scripts(self) -> Path:
        """Where the user runs from."""
        return self.root / "sd-scripts"

    def command(self, out: Path, dataset: Path, *extra: str, steps: int = 6, save_every: int = 2,
                name: str = "tiny") -> list[str]:
        """A LoRA of the U-Net in bf16 (the levers that make SDXL fit a small machine), a state every
        ``save_every`` steps, ``extra`` flags appended."""
        r = self.root
        return [str(r / "venv/bin/accelerate"), "launch", "--config_file", str(r / "accel.yaml"),
                "--num_cpu_threads_per_process", "2", SCRIPT,
                "--pretrained_model_name_or_path", str(r / "model"),
                "--tokenizer_cache_dir", str(r / "model/tokenizer_cache"), "--dataset_config", str(dataset),
                "--output_dir", str(out), "--output_name", name, "--save_model_as", "safetensors",
                "--network_module", "networks.lora", "--network_dim", "4", "--network_alpha", "1",
                "--network_train_unet_only", "--optimizer_type", "AdamW", "--learning_rate", "1e-4",
                "--lr_scheduler", "constant", "--max_train_steps", str(steps), "--save_every_n_steps",
                str(save_every), "--save_state", "--mixed_precision", "bf16", "--full_bf16", "--save_precision",
                "bf16", "--max_data_loader_n_workers", "0", "--seed", "42", *extra]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", COLUMNS="200")
        env.update(extra)
        return env

    def user_data(self, where: Path, general: str = "") -> Path:
        """A copy of the bed's images, captions and prompt file for one test to edit: the dataset TOML of
        the copy (``general`` lines added to its ``[general]`` table)."""
        shutil.copytree(self.root / "data", where)
        toml = where / "dataset.toml"
        text = toml.read_text(encoding="utf-8").replace(str(self.root / "data"), str(where))
        if general:
            text = text.replace("[general]\n", f"[general]\n{general}\n", 1)
        toml.write_text(text, encoding="utf-8")
        return toml


@functools.cache
def build_bed() -> SdxlBed | str:
    """The bed, built if needed (about 1.5 min from scratch with the SD1.5 bed built, seconds when built); or
    why the tier cannot run here. Once per test session."""
    if os.environ.get("TRAINSUP_REALSDXL") != "1":
        return ("TRAINSUP_REALSDXL is not 1: set TRAINSUP_REALSDXL=1 to run the real sd-scripts SDXL tier "
                f"(it builds or reuses the bed with {SETUP}: 5.5 GB of disk beside the SD1.5 bed's, "
                "~11 GB of memory while it builds)")
    if not (ROOT.parent / "shared" / "realkohya" / "setup").is_file():
        return "no sd-scripts snapshot at ../shared/realkohya beside this repository"
    where = os.environ.get("TRAINSUP_REALSDXL_DIR") or str(Path.home() / ".cache" / "trainsup-realsdxl")
    return SdxlBed(built_bed(SETUP, where, "sd-scripts SDXL"))


def trainer_pid(root_pid: int) -> int | None:
    """The python running sdxl_train_network.py under ``root_pid`` (accelerate's child)."""
    found = script_process(root_pid, SCRIPT)
    return found.pid if found is not None else None
