"""The real kohya-ss/sd-scripts trainer on a CPU test bed, and `trainsup run` over it.

``TRAINSUP_SD_SCRIPTS`` names an sd-scripts tree whose parent holds the bed builder ``setup``
(``../shared/realkohya``); the bed is built (or found built, in seconds) in
``TRAINSUP_REALKOHYA_DIR``, else ``~/.cache/trainsup-realkohya``. Every command here is what a user
types: ``accelerate launch ... train_network.py ...`` from the bed's sd-scripts directory.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.conftest import built_bed, script_process

STEPS_PER_EPOCH = 8  # the bed's dataset: 8 images, batch 1
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass(frozen=True)
class Bed:
    root: Path

    @property
    def sd_scripts(self) -> Path:
        return self.root / "sd-scripts"

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    def command(self, out: Path, *extra: str, steps: int = 20, save_every: int = 5,
                dataset: Path | None = None, name: str = "tiny") -> list[str]:
        """The README's working command, as a user types it, with ``extra`` flags appended."""
        r = self.root
        return [str(r / "venv/bin/accelerate"), "launch", "--config_file", str(r / "accel.yaml"),
                "--num_cpu_threads_per_process", "2", "train_network.py",
                "--pretrained_model_name_or_path", str(r / "model"),
                "--tokenizer_cache_dir", str(r / "model/tokenizer_cache"),
                "--dataset_config", str(dataset or r / "data/dataset.toml"),
                "--output_dir", str(out), "--output_name", name, "--save_model_as", "safetensors",
                "--network_module", "networks.lora", "--network_dim", "4", "--network_alpha", "1",
                "--optimizer_type", "AdamW", "--learning_rate", "1e-4", "--lr_scheduler", "constant",
                "--max_train_steps", str(steps), "--save_every_n_steps", str(save_every), "--save_state",
                "--mixed_precision", "no", "--save_precision", "float", "--max_data_loader_n_workers", "0",
                "--seed", "42", *extra]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_")}
        env.update(OFFLINE)
        env.update(extra)
        return env


def build_bed() -> Bed | str:
    """The bed, built if needed; or why the real tier cannot run here."""
    tree = os.environ.get("TRAINSUP_SD_SCRIPTS")
    if not tree:
        return ("TRAINSUP_SD_SCRIPTS is unset: set it to an sd-scripts tree beside a realkohya 'setup' "
                "(e.g. ../shared/realkohya/sd-scripts) to run the real-trainer tier")
    setup = Path(tree).resolve().parent / "setup"
    if not setup.is_file():
        raise RuntimeError(f"TRAINSUP_SD_SCRIPTS={tree}: no bed builder at {setup}")
    where = os.environ.get("TRAINSUP_REALKOHYA_DIR") or str(Path.home() / ".cache" / "trainsup-realkohya")
    return Bed(built_bed(setup, where, "real-trainer",
                         env={**os.environ, **OFFLINE, "PYTHON": os.environ.get("PYTHON", "python3")}))


def trainer_process(root_pid: int) -> psutil.Process | None:
    """The python running train_network.py under ``root_pid`` (accelerate's child, not accelerate)."""
    return script_process(root_pid, "train_network.py")


def trainsup_pid_of(run_dir: Path) -> int | None:
    """The pid of the `trainsup run` whose run dir this is (the harness's only child of that kind)."""
    for p in psutil.Process().children(recursive=False):
        try:
            if "trainsup.cli" in p.cmdline() and str(run_dir.parent) in " ".join(p.cmdline()):
                return p.pid
        except psutil.Error:
            continue
    return None


PYTHON = sys.executable
