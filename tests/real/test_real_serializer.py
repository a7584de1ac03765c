"""A trainer venv whose safetensors is too old for transformers: real sd-scripts dies at import, and
trainsup upgrades the serializer in that venv, then the run finishes.

transformers checks its dependencies' versions when it is imported; with safetensors 0.4.1,
``train_network.py`` stops at ``import diffusers`` (through its PEFT loader) with
``safetensors>=0.4.3 is required for a normal functioning of this module, but found
safetensors==0.4.1.``, before any weights are written, and accelerate reports the exit status.

The user's venv here is a venv of its own that sees the bed's packages (a ``.pth`` line adds the
bed's site-packages after its own) and holds safetensors 0.4.1 and its own ``accelerate`` script, so
the command is the bed's, typed with that venv's ``accelerate``. The bed's venv is never changed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.demo_harness import supervise
from tests.real.bed import Bed

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\n"
REQUIREMENT = "safetensors>=0.4.3 is required for a normal functioning of this module, but found safetensors==0.4.1."


def version(python: Path, package: str) -> str:
    done = subprocess.run([str(python), "-c", f"from importlib.metadata import version; print(version('{package}'))"],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def purelib(python: Path) -> str:
    done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


@pytest.fixture
def old_venv(bed: Bed, tmp_path: Path) -> Path:
    """A user's venv: the bed's packages, but safetensors 0.4.1 (and an ``accelerate`` of its own)."""
    venv = tmp_path / "venv-old-safetensors"
    subprocess.run([str(bed.python), "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    Path(purelib(python), "zz-bed-packages.pth").write_text(f"import site; site.addsitedir({purelib(bed.python)!r})\n")
    # --ignore-installed: pip sees the bed's accelerate through the .pth and would write no script
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed",
                           "safetensors==0.4.1",
                           f"accelerate=={version(bed.python, 'accelerate')}"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert version(python, "safetensors") == "0.4.1"
    return venv


def test_an_import_time_safetensors_requirement_upgrades_the_trainers_own_safetensors_and_the_run_finishes(
        bed: Bed, old_venv: Path, tmp_path: Path) -> None:
    bed_safetensors = version(bed.python, "safetensors")
    out = tmp_path / "out"
    argv = [str(old_venv / "bin" / "accelerate"), *bed.command(out, steps=6, save_every=3)[1:]]
    bare = subprocess.run(argv, cwd=bed.sd_scripts, env=bed.env(), capture_output=True, text=True, timeout=600,
                          check=False)
    assert bare.returncode != 0 and REQUIREMENT in bare.stdout + bare.stderr, (bare.stdout + bare.stderr)[-3000:]
    assert not out.exists() or not list(out.glob("*.safetensors"))  # it died before writing anything

    run = supervise(argv, out, tmp_path, env=bed.env(), policy=POLICY, timeout=900, cwd=bed.sd_scripts)
    assert run.returncode == 0, run.stderr[-3000:]
    fault = run.of("fault")[0]
    assert (fault["class"], fault["attempt"]) == ("fp8_serializer", 1) and REQUIREMENT in fault["evidence"], fault
    [upgrade] = run.of("environment_upgrade")
    assert upgrade["python"] == str(old_venv / "bin" / "python") and upgrade["spec"] == "safetensors>=0.4.3"
    assert upgrade["exit_code"] == 0, upgrade
    new = version(old_venv / "bin" / "python", "safetensors")
    assert tuple(int(x) for x in new.split(".")[:3]) >= (0, 4, 3), new
    assert version(bed.python, "safetensors") == bed_safetensors  # only the trainer's own venv changed
    assert [s["attempt"] for s in run.of("attempt_start")] == [1, 2]
    assert run.of("attempt_start")[1]["resume_from"] is None  # nothing was saved before the import failed
    assert run.events[-1]["event"] == "finished" and (out / "tiny.safetensors").is_file()
    print(f"safetensors 0.4.1 -> {new} in {old_venv}; the run finished (python {sys.version_info[:2]})")
