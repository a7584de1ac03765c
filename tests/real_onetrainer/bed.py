"""The real OneTrainer trainer (``scripts/train.py``, an SD1.5 LoRA on the CPU) on a test bed, and
what the tier's tests share.

The bed is built by ``../shared/realonetrainer/setup`` (beside this repository) in
``TRAINSUP_REALONETRAINER_DIR``, else ``~/.cache/trainsup-realonetrainer``. Every command is what a
user types from the OneTrainer root: ``BED/venv/bin/python scripts/train.py --config-path CONFIG``.
OneTrainer is run as an external program only; nothing of it is imported here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.conftest import ROOT

SETUP = ROOT.parent / "shared" / "realonetrainer" / "setup"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass(frozen=True)
class OTBed:
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    @property
    def cwd(self) -> Path:
        return self.root / "OneTrainer"

    def user_files(self, tmp: Path, epochs: int = 2, **extra: object) -> Path:
        """A user's config (with its own concept and sample files) writing into ``tmp``."""
        shutil.copy(self.root / "concepts.json", tmp / "concepts.json")
        shutil.copy(self.root / "samples.json", tmp / "samples.json")
        doc = json.loads((self.root / "config.json").read_text())
        doc.update(workspace_dir=str(tmp / "ws"), cache_dir=str(tmp / "cache"),
                   output_model_destination=str(tmp / "lora.safetensors"), epochs=epochs,
                   concept_file_name=str(tmp / "concepts.json"),
                   sample_definition_file_name=str(tmp / "samples.json"), **extra)
        cfg = tmp / "config.json"
        cfg.write_text(json.dumps(doc, indent=4))
        return cfg

    def command(self, cfg: Path) -> list[str]:
        return [str(self.python), "scripts/train.py", "--config-path", str(cfg)]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TRAINSUP_DEMO_", "TRAINSUP_OT_")) and k != "PYTHONPATH"}
        env.update(OFFLINE)
        env.update(extra)
        return env

    def run_plain(self, cfg: Path) -> subprocess.CompletedProcess[str]:
        """OneTrainer without trainsup."""
        return subprocess.run(self.command(cfg), cwd=self.cwd, env=self.env(PYTHONUNBUFFERED="1"),
                              capture_output=True, text=True, timeout=600, check=False)

    def max_abs_diff(self, a: Path, b: Path) -> float:
        """The largest difference over every tensor of two safetensors files, read by the bed's
        safetensors and numpy (trainsup and its tests never import torch)."""
        script = ("import json, sys\nfrom safetensors.numpy import load_file\n"
                  "a, b = (load_file(p) for p in sys.argv[1:3])\n"
                  "assert sorted(a) == sorted(b), (sorted(a), sorted(b))\n"
                  "print(json.dumps(max(float(abs(a[k].astype('float64') - b[k].astype('float64')).max()) "
                  "for k in a)))\n")
        done = subprocess.run([str(self.python), "-c", script, str(a), str(b)], capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return float(json.loads(done.stdout.strip().splitlines()[-1]))


def build_bed() -> OTBed | str:
    """The bed, built if needed; or why the tier cannot run here."""
    if os.environ.get("TRAINSUP_REALONETRAINER") != "1":
        return ("TRAINSUP_REALONETRAINER is not 1: set TRAINSUP_REALONETRAINER=1 to run the real-OneTrainer "
                f"tier (it builds or reuses the bed with {SETUP})")
    if not SETUP.is_file():
        return f"no OneTrainer bed builder at {SETUP} (expected ../shared/realonetrainer/setup beside this repository)"
    where = os.environ.get("TRAINSUP_REALONETRAINER_DIR") or str(Path.home() / ".cache" / "trainsup-realonetrainer")
    done = subprocess.run(["bash", str(SETUP), where], capture_output=True, text=True, timeout=3600,
                          env={**os.environ, **OFFLINE}, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"building the OneTrainer bed failed ({SETUP} {where}):\n{done.stderr[-3000:]}")
    return OTBed(Path(done.stdout.strip().splitlines()[-1]))


def trainer_process() -> psutil.Process | None:
    """The python running ``scripts/train.py`` among this test's descendants (not trainsup)."""
    for p in psutil.Process().children(recursive=True):
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if len(argv) > 1 and argv[1] == "scripts/train.py":
            return p
    return None


def digests(*paths: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
