"""The real kohya-ss/musubi-tuner trainer (0.3.4, ``wan_train_network.py --task t2v-1.3B`` on the CPU)
on a test bed, and `trainsup run` over it.

The bed is built by ``../shared/realmusubi/setup`` (beside this repository) in
``TRAINSUP_REALMUSUBI_DIR``, else ``~/.cache/trainsup-realmusubi``: a venv with musubi-tuner installed
from its snapshot, a random-weight Wan2.1 1.3B DiT of the real size, and 4 captioned images whose
latent and text-encoder caches musubi's own caching scripts wrote. Every command here is what a user
types, from ``BED/musubi-tuner``: ``accelerate launch ... src/musubi_tuner/wan_train_network.py ...``.

A run costs about 2 s a step on two idle cores and ~6.4 GB of memory (``--gradient_checkpointing``,
a real user flag, in the command: ~10 GB without), so the tier runs one musubi trainer at a time.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.conftest import ROOT, built_bed, safetensors_max_abs_diff, script_process

SETUP = ROOT.parent / "shared" / "realmusubi" / "setup"
SCRIPT = "wan_train_network.py"
STEPS_PER_EPOCH = 8  # 4 images x num_repeats 2, batch 1
# How far a run resumed by trainsup ends from an uninterrupted one (max |dw| over every LoRA and state
# of the output dir, 20 steps), measured on this bed: musubi restarts its epoch count at 1 after
# --resume, so the resumed epoch's data order (buckets shuffled by dataset seed + epoch) and its noise
# draws are not the uninterrupted run's. Resumed from the state of step 10 (killed at step 12, between
# saves or inside the save of 15): 1.16e-2; from step 5 (the state of 10 cut mid-save): 1.81e-2. Each
# with a little room. The figures stand in docs/reference/adapters.md and docs/measured.md.
RESIDUAL = 1.25e-2
RESIDUAL_FROM_STEP_5 = 2e-2


@dataclass(frozen=True)
class MusubiBed:
    root: Path

    @property
    def musubi(self) -> Path:
        """Where the user runs from (the docs' ``src/musubi_tuner/...`` paths are relative to it)."""
        return self.root / "musubi-tuner"

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    def command(self, out: Path, *extra: str, steps: int = 20, save_every: int = 5, name: str = "tiny",
                dataset: Path | None = None) -> list[str]:
        """The bed README's reference command (20 steps, a state every 5), with ``--gradient_checkpointing``
        (6.4 GB instead of ~10) and ``extra`` flags appended."""
        r = self.root
        return [str(r / "venv/bin/accelerate"), "launch", "--config_file", str(r / "accel.yaml"),
                "--num_cpu_threads_per_process", "2", "--mixed_precision", "bf16",
                f"src/musubi_tuner/{SCRIPT}", "--task", "t2v-1.3B",
                "--dit", str(r / "models/diffusion_pytorch_model.safetensors"),
                "--dataset_config", str(dataset or r / "data/dataset.toml"),
                "--sdpa", "--mixed_precision", "bf16", "--optimizer_type", "AdamW", "--learning_rate", "1e-3",
                "--gradient_checkpointing", "--max_data_loader_n_workers", "0",
                "--network_module", "networks.lora_wan", "--network_dim", "4", "--network_alpha", "1",
                "--timestep_sampling", "shift", "--discrete_flow_shift", "3.0", "--max_train_steps", str(steps),
                "--save_every_n_steps", str(save_every), "--save_state", "--seed", "42",
                "--output_dir", str(out), "--output_name", name, *extra]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_")}
        env.update(HF_HOME=str(self.root / "hf"), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def run_plain(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """The trainer without trainsup (the uninterrupted reference)."""
        return subprocess.run(argv, cwd=self.musubi, env=self.env(), capture_output=True, text=True, timeout=1800,
                              check=False)

    def max_abs_diff(self, a: Path, b: Path) -> float:
        """The largest difference over every tensor of two safetensors files (the same names in both)."""
        return safetensors_max_abs_diff(a, b)


@functools.cache
def build_bed() -> MusubiBed | str:
    """The bed, built if needed (about 4 min from scratch, 10 s when built); or why the tier cannot run
    here. Once per test session (the behaviour suite's musubi bed uses it too)."""
    if os.environ.get("TRAINSUP_REALMUSUBI") != "1":
        return ("TRAINSUP_REALMUSUBI is not 1: set TRAINSUP_REALMUSUBI=1 to run the real-musubi-tuner tier "
                f"(it builds or reuses the bed with {SETUP}: 18 GB of disk, ~10 GB of memory while it builds)")
    if not SETUP.is_file():
        return f"no musubi-tuner bed builder at {SETUP} (expected ../shared/realmusubi/setup beside this repository)"
    where = os.environ.get("TRAINSUP_REALMUSUBI_DIR") or str(Path.home() / ".cache" / "trainsup-realmusubi")
    return MusubiBed(built_bed(SETUP, where, "musubi-tuner"))


def trainer_process(root_pid: int) -> psutil.Process | None:
    """The python running wan_train_network.py under ``root_pid`` (accelerate's child, not accelerate)."""
    return script_process(root_pid, SCRIPT)


def lora_metadata(path: Path) -> dict[str, str]:
    """A safetensors file's ``__metadata__`` (musubi's ``ss_steps``, ``ss_epoch``...), read from its header."""
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    meta: dict[str, str] = header.get("__metadata__", {})
    return meta
