"""The real LitGPT trainer (litgpt 0.5.13, torch CPU) on a test bed, and `trainsup run` over it.

The bed is built by ``../shared/reallitgpt/setup`` (beside this repository) in
``TRAINSUP_REALLITGPT_DIR``, else ``~/.cache/trainsup-reallitgpt``; it holds a venv with the real
``litgpt`` console script, a tiny random-weight checkpoint dir and Alpaca-style data. Every command
here is what a user types: ``DIR/venv/bin/litgpt finetune_lora DIR/checkpoints/tiny-gpt ...``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.conftest import ROOT

SETUP = ROOT.parent / "shared" / "reallitgpt" / "setup"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass(frozen=True)
class LitBed:
    root: Path

    @property
    def litgpt(self) -> Path:
        return self.root / "venv" / "bin" / "litgpt"

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    def command(self, method: str, out: Path, *extra: str, data: str = "instructions.json") -> list[str]:
        """The bed README's working command (20 steps, a state every 5), ``extra`` flags appended."""
        r = self.root
        return [str(self.litgpt), method, str(r / "checkpoints" / "tiny-gpt"), "--out_dir", str(out),
                "--precision", "32-true", "--data", "JSON", "--data.json_path", str(r / "data" / data),
                "--data.val_split_fraction", "0.125", "--data.num_workers", "0",
                "--train.global_batch_size", "4", "--train.micro_batch_size", "4", "--train.epochs", "1000",
                "--train.max_steps", "20", "--train.save_interval", "5", "--train.lr_warmup_steps", "2",
                "--eval.interval", "10", "--eval.max_iters", "2", "--eval.max_new_tokens", "8", *extra]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_")}
        env.update(OFFLINE)
        env.update(extra)
        return env

    def run_plain(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """The trainer without trainsup (the uninterrupted reference)."""
        return subprocess.run(argv, env=self.env(PYTHONUNBUFFERED="1"), capture_output=True, text=True,
                              timeout=600, check=False)

    def max_abs_diff(self, a: Path, b: Path) -> float:
        """The largest difference over every tensor of two torch.save files, read by the bed's torch
        (the supervisor and its tests never import torch for the trainer's files)."""
        script = ("import json, sys, torch\n"
                  "a, b = (torch.load(p, weights_only=True) for p in sys.argv[1:3])\n"
                  "a, b = a.get('model', a), b.get('model', b)\n"
                  "assert sorted(a) == sorted(b), (sorted(a), sorted(b))\n"
                  "print(json.dumps(max((a[k].double() - b[k].double()).abs().max().item() for k in a)))\n")
        done = subprocess.run([str(self.python), "-c", script, str(a), str(b)], capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return float(json.loads(done.stdout.strip().splitlines()[-1]))


@functools.cache
def build_bed() -> LitBed | str:
    """The bed, built if needed; or why the tier cannot run here. Once per test session: the setup's
    check costs about 12 s even when the bed is built, and tests/slurm uses the bed too."""
    if os.environ.get("TRAINSUP_REALLITGPT") != "1":
        return ("TRAINSUP_REALLITGPT is not 1: set TRAINSUP_REALLITGPT=1 to run the real-LitGPT tier "
                f"(it builds or reuses the bed with {SETUP})")
    if not SETUP.is_file():
        return f"no LitGPT bed builder at {SETUP} (expected ../shared/reallitgpt/setup beside this repository)"
    where = os.environ.get("TRAINSUP_REALLITGPT_DIR") or str(Path.home() / ".cache" / "trainsup-reallitgpt")
    done = subprocess.run(["bash", str(SETUP), where], capture_output=True, text=True, timeout=3600,
                          env={**os.environ, **OFFLINE}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the LitGPT bed failed ({SETUP} {where}):\n{done.stderr[-3000:]}")
    return LitBed(Path(done.stdout.strip().splitlines()[-1]))


def trainer_process(litgpt: Path, method: str) -> psutil.Process | None:
    """The python running ``litgpt METHOD`` among this test's descendants (not trainsup itself)."""
    for p in psutil.Process().children(recursive=True):
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if argv[1:3] == [str(litgpt), method]:
            return p
    return None


class KillAtLine(threading.Thread):
    """SIGKILL the trainer the moment ``text`` shows in the attempt's log (trainsup writes the
    trainer's bytes there as they arrive)."""

    def __init__(self, log: Path, text: str, litgpt: Path, method: str, timeout: float = 300,
                 after: Callable[[], None] | None = None) -> None:
        super().__init__(daemon=True)
        self.log, self.text, self.litgpt, self.method, self.timeout = log, text, litgpt, method, timeout
        self.after = after  # run right after the kill
        self.killed = False

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        trainer: psutil.Process | None = None
        pos, tail, want = 0, b"", self.text.encode()
        while time.monotonic() < deadline:
            if trainer is None:  # found before the line comes, so the kill follows it at once
                trainer = trainer_process(self.litgpt, self.method)
            try:
                with open(self.log, "rb") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
            except FileNotFoundError:
                chunk = b""
            pos += len(chunk)
            tail = (tail + chunk)[-4096:]
            if want in tail and trainer is not None:
                trainer.kill()
                trainer.wait(timeout=30)
                self.killed = True
                if self.after is not None:
                    self.after()
                return
            time.sleep(0.002)
