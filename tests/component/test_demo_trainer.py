"""The demo trainer as real child processes: outputs, resume quirks, kohya failure modes, launcher."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.conftest import wait_until
from trainsup.demo.logfmt import RichLikeHandler, format_meter
from trainsup.demo.make_assets import make_assets
from trainsup.demo.png import read_png

SD = [sys.executable, "-m", "trainsup.demo.train_network"]
FLUX = [sys.executable, "-m", "trainsup.demo.flux_train_network"]
LAUNCH = [sys.executable, "-m", "trainsup.demo.launch"]


def demo_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSUP_DEMO_")}
    env.update({"COLUMNS": "250", "PYTHONUNBUFFERED": "1"}, **extra)
    return env


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or demo_env(), check=False)


def base_args(assets: dict[str, Path], out: Path, *extra: str, model: str = "model") -> list[str]:
    return ["--pretrained_model_name_or_path", str(assets[model]), "--train_data_dir", str(assets["dataset"]),
            "--output_dir", str(out), *extra]


def bars(stderr: str) -> list[str]:
    """The training bar's refreshes: tqdm separates them with \\r, not newlines."""
    return [m.group(0) for m in re.finditer(r"steps: [^\r\n]*?\]", stderr)]


# 8 images, batch 2: 4 steps per epoch, 5 epochs for 20 steps (the layout of kohya.md's measurement)
RESUME_FLAGS = ["--max_train_steps", "20", "--seed", "7", "--train_batch_size", "2",
                "--save_every_n_steps", "5", "--save_state"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture(scope="module")
def full_run(assets: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("full")
    proc = run(SD + base_args(assets, out, *RESUME_FLAGS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_make_assets_writes_models_dataset_and_prompts(assets: dict[str, Path]) -> None:
    images = sorted(assets["subset"].glob("*.png"))
    assert len(images) == 8 and assets["subset"].name == "1_demo"
    for image in images:
        assert read_png(image).shape == (16, 16, 3)
        assert image.with_suffix(".txt").read_text().strip()
    assert len({read_png(i).tobytes() for i in images}) == 8
    base, fp8 = load_file(str(assets["model"])), load_file(str(assets["model_fp8"]))
    assert any(k.startswith("unet.") for k in base) and not any(k.startswith("unet.") for k in fp8)
    fp8_unet = {k: v for k, v in fp8.items() if k.startswith("model.diffusion_model.")}
    assert fp8_unet and any(v.dtype == torch.float8_e4m3fn for v in fp8_unet.values())
    assert assets["model"].stat().st_size < 2_000_000
    prompts = [line for line in assets["prompts"].read_text().splitlines() if line and not line.startswith("#")]
    assert prompts and all("--w 16" in p for p in prompts)


def test_full_run_saves_steps_states_and_final(full_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = full_run
    assert "model saved." in proc.stderr
    assert "running training / 学習開始" in proc.stdout and "  num epochs / epoch数: 5" in proc.stdout
    assert "  total optimization steps / 学習ステップ数: 20" in proc.stdout
    assert "\nepoch 5/5\n" in proc.stdout
    for step in (5, 10, 15, 20):
        assert f"saving checkpoint: {out}/at-step{step:08d}.safetensors" in proc.stdout
        state = out / f"at-step{step:08d}-state"
        names = {p.name for p in state.iterdir()}
        assert names == {"train_state.json", "model.safetensors", "optimizer.bin", "scheduler.bin",
                         "random_states_0.pkl"}
        assert json.loads((state / "train_state.json").read_text())["current_step"] == step
        assert f"Random states saved in {state}/random_states_0.pkl" in proc.stderr
    assert (out / "last.safetensors").exists() and (out / "last-state" / "random_states_0.pkl").exists()
    weights = load_file(str(out / "last.safetensors"))
    assert weights and all(v.dtype == torch.float32 for v in weights.values())
    assert any("lora_up" in k and v.abs().sum() > 0 for k, v in weights.items())
    refreshes = bars(proc.stderr)
    assert refreshes[0] == "steps:   0%|          | 0/20 [00:00<?, ?it/s]"
    assert re.fullmatch(r"steps: 100%\|██████████\| 20/20 \[.*, avr_loss=[0-9.e+-]+\]", refreshes[-1])


def test_resume_with_skip_matches_the_uninterrupted_run(
    full_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path, assets: dict[str, Path]
) -> None:
    full_out, _ = full_run
    state = tmp_path / "at-step00000010-state"
    subprocess.run(["cp", "-r", str(full_out / state.name), str(state)], check=True)
    proc = run(SD + base_args(assets, tmp_path, *RESUME_FLAGS, "--resume", str(state), "--skip_until_initial_step"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resume training from local state: {state}" in proc.stderr
    assert "skipping 10 steps" in proc.stderr
    assert "skipping epoch 2 because initial_step (multiplied) is 6" in proc.stderr
    assert bars(proc.stderr)[-1].startswith("steps:  56%|█████▌    | 10/18 [")  # 10 steps, kohya's bar total
    expected, got = load_file(str(full_out / "last.safetensors")), load_file(str(tmp_path / "last.safetensors"))
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.allclose(expected[key], got[key], rtol=0, atol=1e-7), key
    # kohya labels the post-resume steps from the position inside the epoch: 5 and 10 again
    assert json.loads((tmp_path / "at-step00000010-state" / "train_state.json").read_text())["current_step"] == 10
    assert json.loads((tmp_path / "last-state" / "train_state.json").read_text())["current_step"] == 12


def test_resume_without_skip_retrains_and_overwrites(
    full_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path, assets: dict[str, Path]
) -> None:
    full_out, _ = full_run
    state = tmp_path / "at-step00000010-state"
    subprocess.run(["cp", "-r", str(full_out / state.name), str(state)], check=True)
    before = (state / "model.safetensors").read_bytes()
    proc = run(SD + base_args(assets, tmp_path, *RESUME_FLAGS, "--resume", str(state)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # epoch 3 is trained again from its start: 12 more steps, the bar stops at 12/20
    assert "epoch 3/5" in proc.stdout and "epoch 2/5" not in proc.stdout
    assert bars(proc.stderr)[-1].startswith("steps:  60%|██████    | 12/20 [")
    assert json.loads((tmp_path / "last-state" / "train_state.json").read_text())["current_step"] == 12
    # the state it resumed from was overwritten by the new (wrongly labelled) step 10
    assert (state / "model.safetensors").read_bytes() != before
    assert (tmp_path / "at-step00000005.safetensors").exists()


def test_fp8_checkpoint_needs_fp8_base(assets: dict[str, Path], tmp_path: Path) -> None:
    proc = run(FLUX + base_args(assets, tmp_path / "a", "--max_train_steps", "4", model="model_fp8"))
    assert proc.returncode == 1
    assert "Loaded Flux: _IncompatibleKeys(missing_keys=['in_proj.weight'" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith(
        "NotImplementedError: Cannot copy out of meta tensor; no data!")
    assert "model saved." not in proc.stderr

    out = tmp_path / "b"
    proc = run(FLUX + base_args(assets, out, "--max_train_steps", "4", "--fp8_base", "--mixed_precision", "bf16",
                                "--save_state", model="model_fp8"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with safe_open(str(out / "last-state" / "model.safetensors"), "pt") as f:
        assert "F8_E4M3" in {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    assert {v.dtype for v in load_file(str(out / "last.safetensors")).values()} == {torch.float32}

    proc = run(FLUX + base_args(assets, tmp_path / "c", "--max_train_steps", "4", "--fp8_base", model="model_fp8"))
    assert proc.returncode == 1
    assert "AssertionError: fp8_base requires mixed precision='fp16' or 'bf16'" in proc.stderr


def test_flags_that_do_not_exist_fail_like_argparse(assets: dict[str, Path], tmp_path: Path) -> None:
    proc = run(SD + base_args(assets, tmp_path, "--cache_text_encoder_outputs"))
    assert proc.returncode == 2
    assert "train_network.py: error: unrecognized arguments: --cache_text_encoder_outputs" in proc.stderr
    proc = run(FLUX + base_args(assets, tmp_path, "--lowvram"))
    assert proc.returncode == 2
    assert "flux_train_network.py: error: unrecognized arguments: --lowvram" in proc.stderr


def test_prompt_edited_mid_run_breaks_flux_te_cache(assets: dict[str, Path], tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(assets["prompts"].read_text())
    out = tmp_path / "out"
    cmd = FLUX + base_args(assets, out, "--max_train_steps", "20", "--seed", "1", "--sample_prompts", str(prompts),
                           "--sample_every_n_steps", "5", "--save_every_n_steps", "5", "--save_state",
                           "--cache_text_encoder_outputs", "--max_data_loader_n_workers", "1")
    # pacing leaves time to edit the file between the samples of step 5 and step 10
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=demo_env(TRAINSUP_DEMO_STEP_SECONDS="0.15"))
    try:
        # kohya's names: STEP6_II_TIMESTAMP[_SEED].png
        wait_until(lambda: any((out / "sample").glob("000005_01_*.png")), timeout=60, what="first samples")
        with open(prompts, "a") as f:
            f.write("a prompt added while training --w 16 --h 16 --d 3\n")
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1
    assert stderr.rstrip().splitlines()[-1] == "AttributeError: 'NoneType' object has no attribute 'to'"
    used = [json.loads(x) for x in (out / "sample" / "prompts_used.jsonl").read_text().splitlines()]
    assert [(u["step"], u["index"]) for u in used] == [(5, 0), (5, 1), (10, 0), (10, 1)]
    # sampling comes before the save: step 10's state was never written
    assert (out / "at-step00000005-state").is_dir() and not (out / "at-step00000010-state").exists()


def test_launcher_reports_child_failure_like_accelerate(assets: dict[str, Path], tmp_path: Path) -> None:
    proc = run(LAUNCH + ["-m", "trainsup.demo.train_network", "--lowvram"])
    assert proc.returncode == 1
    last = proc.stderr.rstrip().splitlines()[-1]
    assert last.startswith("subprocess.CalledProcessError: Command '[")
    assert "'-m', 'trainsup.demo.train_network', '--lowvram']' returned non-zero exit status 2." in last

    script = tmp_path / "killed.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    proc = run(LAUNCH + ["--num_processes", "1", str(script)])
    assert proc.returncode == 1
    assert proc.stderr.rstrip().endswith("died with <Signals.SIGKILL: 9>.")

    proc = run(LAUNCH + ["--num_processes", "1", "-m", "trainsup.demo.train_network"]
               + base_args(assets, tmp_path / "ok", "--max_train_steps", "2"))
    assert proc.returncode == 0 and "model saved." in proc.stderr


def test_divergent_learning_rate_shows_nan_and_no_data_exits_zero(assets: dict[str, Path], tmp_path: Path) -> None:
    proc = run(SD + base_args(assets, tmp_path / "nan", "--max_train_steps", "12", "--learning_rate", "1e8"))
    assert proc.returncode == 0
    assert bars(proc.stderr)[-1].endswith("avr_loss=nan]")

    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run(SD + ["--pretrained_model_name_or_path", str(assets["model"]), "--train_data_dir", str(empty),
                     "--output_dir", str(tmp_path / "none"), "--console_log_simple"])
    assert proc.returncode == 0
    assert "No data found. Please verify arguments (train_data_dir must be the parent of folders with images)" \
        in proc.stdout
    assert "model saved." not in proc.stdout and not (tmp_path / "none").exists()


def test_old_safetensors_cannot_save_an_fp8_state(assets: dict[str, Path], tmp_path: Path,
                                                  old_safetensors_venv: Path) -> None:
    python = str(old_safetensors_venv / "bin" / "python")
    proc = run([python, "-m", "trainsup.demo.flux_train_network"]
               + base_args(assets, tmp_path, "--max_train_steps", "4", "--fp8_base", "--mixed_precision", "bf16",
                           "--save_state", "--save_every_n_steps", "2"))
    assert proc.returncode == 1
    assert proc.stderr.rstrip().splitlines()[-1] == "KeyError: torch.float8_e4m3fn"
    assert (tmp_path / "at-step00000002.safetensors").exists()
    assert not (tmp_path / "at-step00000002-state" / "random_states_0.pkl").exists()


def test_console_formats_match_rich_and_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import logging

    monkeypatch.setenv("COLUMNS", "80")
    stream = io.StringIO()
    handler = RichLikeHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    record = logging.LogRecord("x", logging.INFO, "/a/train_network.py", 1234,
                               "Model weights saved in /tmp/out/at-step00000005-state/model.safetensors", None, None)
    lines = handler.render(record).splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO     Model weights saved in +train_network.py:1234",
                        lines[0])
    assert all(len(line) == 80 for line in lines)
    assert [line.strip() for line in lines[1:]] == ["/tmp/out/at-step00000005-stat", "e/model.safetensors"]
    assert handler.render(record).startswith(" " * 19 + " INFO")  # same second: time blanked
    assert format_meter(2, 20, 1.7, "steps", "avr_loss=0.123") == \
        "steps:  10%|█         | 2/20 [00:01<00:15,  1.18it/s, avr_loss=0.123]"
    assert format_meter(3, 20, 9.0, "steps", "") == "steps:  15%|█▌        | 3/20 [00:09<00:51,  3.00s/it]"
    assert format_meter(22, 20, 5.0, "steps", "") == "steps: 22it [00:05,  4.40it/s]"
