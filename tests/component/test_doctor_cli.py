"""`trainsup doctor` as users run it: real subprocesses over the demo trainer's commands and assets,
and a real venv whose safetensors (0.4.1) is too old for float8."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_trainsup

DEMO = ["-m", "trainsup.demo.train_network"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("doctor-assets")
    subprocess.run([sys.executable, "-m", "trainsup.demo.make_assets", str(out)], check=True, capture_output=True,
                   timeout=120)
    return out


def command(assets: Path, tmp_path: Path, *extra: str, python: str = sys.executable,
            model: str = "model.safetensors") -> list[str]:
    return [python, *DEMO, "--pretrained_model_name_or_path", str(assets / model),
            "--train_data_dir", str(assets / "dataset"), "--output_dir", str(tmp_path / "out"),
            "--save_state", "--save_every_n_steps", "4", "--max_train_steps", "20", *extra]


def doctor(args: list[str], *, as_json: bool = False) -> subprocess.CompletedProcess[str]:
    return run_trainsup(["doctor", *(["--json"] if as_json else []), "--", *args], cwd=ROOT, timeout=120)


def findings(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith(("BLOCKER ", "WARNING "))]


def test_a_clean_demo_command_passes(assets: Path, tmp_path: Path) -> None:
    result = doctor(command(assets, tmp_path))
    assert result.returncode == 0, result.stdout
    assert findings(result) == []
    assert "INFO gpu: GPU memory not checked: " in result.stdout  # no GPU here: information, not a warning
    as_json = doctor(command(assets, tmp_path), as_json=True)
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and {f["severity"] for f in report["findings"]} == {"info"}
    assert report["python"] == sys.executable and report["versions"]["safetensors"] is not None


def test_an_fp8_repack_without_fp8_base_is_a_warning(assets: Path, tmp_path: Path) -> None:
    result = doctor(command(assets, tmp_path, model="model_fp8.safetensors"))
    assert result.returncode == 1
    (line,) = findings(result)
    assert line.startswith("WARNING fp8_weights_without_fp8_base: --pretrained_model_name_or_path holds float8 "
                           "weights (F8_E4M3)")
    assert line.endswith("— fix: add --fp8_base (with --mixed_precision bf16)")


def test_lowvram_is_a_blocker(assets: Path, tmp_path: Path) -> None:
    result = doctor(command(assets, tmp_path, "--lowvram"))
    assert result.returncode == 2
    assert findings(result) == [("BLOCKER unknown_flag: --lowvram: no kohya script has it (it is an AUTOMATIC1111/"
                                "ComfyUI option); to save VRAM use --gradient_checkpointing, --fp8_base or, in DiT "
                                "scripts, --blocks_to_swap; the trainer would stop with 'unrecognized arguments' — "
                                "fix: remove --lowvram")]
    as_json = json.loads(doctor(command(assets, tmp_path, "--lowvram"), as_json=True).stdout)
    assert [(f["severity"], f["id"], f["fix"]) for f in as_json["findings"] if f["severity"] != "info"] == [
        ("blocker", "unknown_flag", "remove --lowvram")]


def test_fp8_base_with_an_old_safetensors_names_the_upgrade_for_that_interpreter(
        assets: Path, tmp_path: Path, old_safetensors_venv: Path) -> None:
    python = str(old_safetensors_venv / "bin" / "python")
    result = doctor(command(assets, tmp_path, "--fp8_base", "--mixed_precision", "bf16", python=python))
    assert result.returncode == 2
    (line,) = findings(result)
    assert line.startswith(f"BLOCKER fp8_serializer: --fp8_base with safetensors 0.4.1 in {python}")
    assert line.endswith(f'— fix: {python} -m pip install "safetensors>=0.4.2"')
    report = json.loads(doctor(command(assets, tmp_path, "--fp8_base", python=python), as_json=True).stdout)
    assert report["python"] == python and report["versions"]["safetensors"] == "0.4.1"
    assert {f["id"] for f in report["findings"] if f["severity"] == "blocker"} == {
        "fp8_serializer", "fp8_needs_mixed_precision"}


def test_no_command_is_bad_usage() -> None:
    result = run_trainsup(["doctor"], cwd=ROOT)
    assert result.returncode == 2 and "give the training command after `--`" in result.stderr
