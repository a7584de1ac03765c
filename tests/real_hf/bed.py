"""TRL's real ``trl sft`` (transformers' Trainer, torch CPU) on a test bed, and the helpers its tier uses.

The bed is built by ``../shared/realhf/setup`` (beside this repository) in ``TRAINSUP_REALHF_DIR``, else
``~/.cache/trainsup-realhf``: a venv with the real ``trl`` console script, a tiny random-weight Llama and 64
chat examples. Every command here is what a user types (the bed README's): ``DIR/venv/bin/trl sft ...``,
20 steps of batch 8 (8 steps an epoch), a checkpoint every 5.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.conftest import ROOT, built_bed

SETUP = ROOT.parent / "shared" / "realhf" / "setup"
CHILD = "sft.py"  # the training process: `trl` runs `accelerate launch .../trl/scripts/sft.py` as its child


@dataclass(frozen=True)
class HfBed:
    root: Path

    @property
    def trl(self) -> Path:
        return self.root / "venv" / "bin" / "trl"

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    def command(self, out: Path, *extra: str, bf16_off: bool = True) -> list[str]:
        """The README's command (``bf16_off`` False: without ``--bf16 false``, TRL's bf16 default on a CPU)."""
        r = self.root
        return [str(self.trl), "sft", "--model_name_or_path", str(r / "model" / "tiny-llama"),
                "--dataset_name", str(r / "data" / "chat"), "--output_dir", str(out), "--max_steps", "20",
                "--save_steps", "5", "--logging_steps", "1", "--per_device_train_batch_size", "8",
                *(["--bf16", "false"] if bf16_off else []), *extra]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_")}
        env.update(HF_HOME=str(self.root / "hf-home"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1")
        env.update(extra)
        return env

    def run_plain(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        """The trainer without trainsup (the uninterrupted reference)."""
        return subprocess.run(argv, cwd=cwd, env=self.env(PYTHONUNBUFFERED="1"), capture_output=True, text=True,
                              timeout=600, check=False)

    def max_abs_diff(self, a: Path, b: Path) -> float:
        """The largest difference over every tensor of two safetensors files, read by the bed's torch."""
        script = ("import json, sys\nfrom safetensors.torch import load_file\n"
                  "a, b = (load_file(p) for p in sys.argv[1:3])\n"
                  "assert sorted(a) == sorted(b), (sorted(a), sorted(b))\n"
                  "print(json.dumps(max((a[k].double() - b[k].double()).abs().max().item() for k in a)))\n")
        done = subprocess.run([str(self.python), "-c", script, str(a), str(b)], capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return float(json.loads(done.stdout.strip().splitlines()[-1]))


@functools.cache
def build_bed() -> HfBed | str:
    """The bed, built if needed; or why the tier cannot run here."""
    if os.environ.get("TRAINSUP_REALHF") != "1":
        return ("TRAINSUP_REALHF is not 1: set TRAINSUP_REALHF=1 to run the real Hugging Face Trainer tier "
                f"(it builds or reuses the bed with {SETUP}: ~2.5 min and 1.5 GB the first time)")
    if not SETUP.is_file():
        return f"no Hugging Face Trainer bed builder at {SETUP} (expected ../shared/realhf/setup beside this repo)"
    where = os.environ.get("TRAINSUP_REALHF_DIR") or str(Path.home() / ".cache" / "trainsup-realhf")
    return HfBed(built_bed(SETUP, where, "Hugging Face Trainer"))


def processes_of(out: Path) -> list[psutil.Process]:
    """Every live process on the box whose command line names ``out`` (a trainer writing there)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and str(out) in (p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def trainer_of(out: Path, parent: bool = False) -> psutil.Process | None:
    """The training child writing ``out`` (``parent``: the ``trl`` process that started it)."""
    for p in processes_of(out):
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        is_child = len(argv) > 1 and Path(argv[1]).name == CHILD
        is_parent = len(argv) > 2 and Path(argv[1]).name == "trl" and argv[2] == "sft"
        if (parent and is_parent) or (not parent and is_child):
            return p
    return None


class KillAfter(threading.Thread):
    """SIGKILL the trainer (its training child, as the OOM killer would; ``parent``: only the ``trl``
    process) as soon as the attempt's log shows the step-``epoch`` loss dict: the step after the
    checkpoint the test wants behind it. ``newest`` then holds the checkpoints complete at the kill."""

    def __init__(self, log: Path, out: Path, epoch: str, parent: bool = False, timeout: float = 300) -> None:
        super().__init__(daemon=True)
        self.log, self.out, self.want, self.parent, self.timeout = log, out, f"'epoch': '{epoch}'", parent, timeout
        self.killed: psutil.Process | None = None
        self.complete_at_kill: list[str] = []

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        target: psutil.Process | None = None
        pos, tail, want = 0, b"", self.want.encode()
        while time.monotonic() < deadline:
            if target is None:
                target = trainer_of(self.out, self.parent)
            try:
                with open(self.log, "rb") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
            except FileNotFoundError:
                chunk = b""
            pos += len(chunk)
            tail = (tail + chunk)[-8192:]
            if want in tail and target is not None:
                target.kill()
                self.killed = target
                self.complete_at_kill = sorted(p.parent.name for p in self.out.glob("checkpoint-*/trainer_state.json"))
                return
            time.sleep(0.001)
