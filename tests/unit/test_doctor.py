"""doctor's checks in process, through its seams: a fake version probe, no GPU, a fake free-disk figure."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from trainsup.adapters.kohya.prepare import prepare
from trainsup.commands.doctor import doctor, format_text
from trainsup.run.policy import Policy
from trainsup.sensors import gpu
from trainsup.trainers.interpreter import Probe, at_least, parse_version
from trainsup.trainers.sthead import HeaderError, float8_dtypes, load_header, read_header

GIB = 1 << 30


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]], cut: int = 0) -> Path:
    """A real safetensors layout (zeros for data) without needing numpy or torch."""
    size = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes((struct.pack("<Q", len(raw)) + raw + b"\0" * offset)[: -cut or None])
    return path


def versions(**v: str | None) -> Callable[..., Probe]:
    def probe(python: str, packages: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Probe:
        installed = {"torch": "2.13.0", "safetensors": "0.4.5", "accelerate": "1.6.0", **v}
        return Probe(python, {name: installed.get(name) for name in packages})
    return probe


@pytest.fixture
def kohya(tmp_path: Path) -> Path:
    """A working directory with a fake sd-scripts checkout, model, dataset and prompts."""
    for script in ("train_network.py", "sdxl_train_network.py", "flux_train_network.py"):
        (tmp_path / script).write_text("# stand-in\n")
    write_safetensors(tmp_path / "model.safetensors",
                      {"unet.a.weight": ("BF16", (64, 32)), "unet.a.bias": ("F32", (64,))})
    write_safetensors(tmp_path / "flux_fp8.safetensors", {"model.diffusion_model.x.weight": ("F8_E4M3", (64, 64))})
    (tmp_path / "data" / "10_sks").mkdir(parents=True)
    (tmp_path / "data" / "10_sks" / "a.png").write_bytes(b"\x89PNG")
    (tmp_path / "prompts.txt").write_text("a photo --w 512 --h 512\n")
    return tmp_path


def run(cwd: Path, *args: str, free: int = 500 * GIB, probe: Callable[..., Probe] | None = None,
        env: dict[str, str] | None = None) -> tuple[list[tuple[str, str]], str]:
    argv = [sys.executable, *args]
    report = doctor(argv, cwd, env or {"PATH": str(Path(sys.executable).parent)},
                    gpu_probe=lambda: gpu.NullProbe("no GPU here"), probe=probe or versions(),
                    disk_free=lambda _p: free)
    return [(f.severity, f.id) for f in report.findings if f.severity != "info"], format_text(report)


BASE = ("--train_data_dir", "data", "--output_dir", "out", "--save_state", "--save_every_n_steps", "100")


def test_headers_are_read_without_loading_tensors(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "m.safetensors", {"a": ("F8_E4M3", (4, 4)), "b": ("F32", (2,))})
    assert read_header(path)["a"]["dtype"] == "F8_E4M3"
    header = load_header(path)
    assert float8_dtypes(header) == {"F8_E4M3": 1} and header.missing_bytes() == 0
    short = write_safetensors(tmp_path / "short.safetensors", {"a": ("F32", (4, 4))}, cut=10)
    assert load_header(short).missing_bytes() == 10
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(HeaderError, match="does not fit"):
        load_header(tmp_path / "junk.safetensors")


@pytest.mark.parametrize(("version", "bound", "expected"), [
    ("0.4.1", (0, 4, 2), False), ("0.4.2", (0, 4, 2), True), ("0.4.2rc1", (0, 4, 2), False),
    ("2.13.0+cpu", (2, 1), True), ("1.0", (0, 33), True), ("0.32.1", (0, 33), False), ("weird", (1,), None),
])
def test_versions_compare_by_release(version: str, bound: tuple[int, ...], expected: bool | None) -> None:
    assert at_least(version, bound) is expected
    assert parse_version("v2.1.0.dev3") == ((2, 1, 0), True)


def test_a_clean_kohya_command_has_no_findings(kohya: Path) -> None:
    findings, text = run(kohya, "train_network.py", "--pretrained_model_name_or_path", "model.safetensors", *BASE)
    assert findings == []
    assert "INFO gpu: GPU memory not checked: no GPU here" in text and text.endswith("0 blocker(s), 0 warning(s)")


def test_flags_the_script_does_not_have(kohya: Path) -> None:
    findings, text = run(kohya, "train_network.py", "--pretrained_model_name_or_path", "model.safetensors", *BASE,
                         "--cache_text_encoder_outputs", "--blocks_to_swap", "8", "--lowvram", "--no-half-vae")
    assert findings == [("blocker", "unknown_flag")] * 4
    assert "--no-half-vae: kohya's flags use underscores (--no_half_vae)" in text
    assert "— fix: remove --lowvram" in text
    dit, _ = run(kohya, "flux_train_network.py", "--pretrained_model_name_or_path", "model.safetensors", *BASE,
                 "--blocks_to_swap", "8", "--cache_text_encoder_outputs")
    assert dit == []


def test_fp8_weights_and_flags(kohya: Path) -> None:
    warn, text = run(kohya, "flux_train_network.py", "--pretrained_model_name_or_path", "flux_fp8.safetensors", *BASE)
    assert warn == [("warning", "fp8_weights_without_fp8_base")] and "(F8_E4M3)" in text
    blocker, text = run(kohya, "flux_train_network.py", "--pretrained_model_name_or_path", "flux_fp8.safetensors",
                        *BASE, "--fp8_base")
    assert blocker == [("blocker", "fp8_needs_mixed_precision")] and "fix: add --mixed_precision bf16" in text
    old, text = run(kohya, "flux_train_network.py", "--pretrained_model_name_or_path", "flux_fp8.safetensors",
                    *BASE, "--fp8_base", "--mixed_precision", "bf16", probe=versions(safetensors="0.4.1"))
    assert old == [("blocker", "fp8_serializer")]
    assert f'fix: {sys.executable} -m pip install "safetensors>=0.4.2"' in text
    # A float8 model cannot even be loaded by that safetensors: the finding says so.
    assert "cannot even load the model (SafetensorError: Dtype not understood: F8_E4M3)" in text


def test_resume_needs_a_complete_state_and_a_new_enough_serializer(kohya: Path) -> None:
    state = kohya / "out" / "lora-step00000100-state"
    state.mkdir(parents=True)
    args = ("train_network.py", "--pretrained_model_name_or_path", "model.safetensors", *BASE, "--resume", str(state))
    assert run(kohya, *args)[0] == [("blocker", "incomplete_resume")]
    (state / "train_state.json").write_text('{"current_epoch": 1, "current_step": 100}')
    write_safetensors(state / "model.safetensors", {"lora.down": ("F32", (4, 4))})
    for name in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
        (state / name).write_bytes(b"x")
    assert run(kohya, *args)[0] == []
    findings, text = run(kohya, *args, probe=versions(safetensors="0.4.2", accelerate="0.33.0"))
    assert findings == [("blocker", "resume_serializer")] and '"safetensors>=0.4.3"' in text
    assert run(kohya, *args, probe=versions(safetensors="0.4.2", accelerate="0.32.1"))[0] == []


def test_text_encoder_caching_with_caption_augmentation(kohya: Path) -> None:
    flux = ("flux_train_network.py", "--pretrained_model_name_or_path", "model.safetensors", "--output_dir", "out",
            "--save_state", "--save_every_n_steps", "100", "--cache_text_encoder_outputs")
    findings, text = run(kohya, *flux, "--train_data_dir", "data", "--shuffle_caption", "--caption_dropout_rate", "0.1")
    assert findings == [("blocker", "te_cache_with_caption_augmentation")]
    assert "--shuffle_caption, --caption_dropout_rate (the command line)" in text
    (kohya / "dataset.toml").write_text(
        '[general]\nshuffle_caption = false\n[[datasets]]\n[[datasets.subsets]]\nimage_dir = "data/10_sks"\n'
        "caption_tag_dropout_rate = 0.2\n[[datasets.subsets]]\nimage_dir = \"nowhere\"\n")
    findings, text = run(kohya, *flux, "--dataset_config", "dataset.toml", "--shuffle_caption")
    assert findings == [("blocker", "missing_dataset"), ("blocker", "te_cache_with_caption_augmentation")]
    # subset > dataset > general > command line: general's shuffle_caption = false beats the flag
    assert "cannot be used with --caption_tag_dropout_rate (datasets[0].subsets[0])" in text
    assert "dataset.toml datasets[0].subsets[1].image_dir nowhere: no such directory" in text


def test_missing_files_are_blockers(kohya: Path) -> None:
    findings, text = run(kohya, "train_network.py", "--pretrained_model_name_or_path", "gone.safetensors",
                         "--train_data_dir", "nodata", "--output_dir", "out", "--sample_prompts", "p.txt",
                         "--config_file", "cfg.toml")
    assert {f for f in findings if f[0] == "blocker"} == {
        ("blocker", "missing_model"), ("blocker", "missing_dataset"), ("blocker", "missing_prompts"),
        ("blocker", "config_file")}
    hub, text = run(kohya, "train_network.py", "--pretrained_model_name_or_path", "runwayml/stable-diffusion-v1-5",
                    *BASE)
    assert hub == [] and "INFO model_from_hub" in text
    (kohya / "empty").mkdir()
    empty, text = run(kohya, "train_network.py", "--pretrained_model_name_or_path", "model.safetensors",
                      "--train_data_dir", "empty", "--output_dir", "out", "--save_state", "--save_every_n_steps", "1")
    assert empty == [("blocker", "missing_dataset")] and "No data found" in text
    script, _ = run(kohya, "sd3_train_network.py", "--pretrained_model_name_or_path", "model.safetensors", *BASE)
    assert script == [("blocker", "missing_script")]


def test_the_config_file_counts_as_the_command_line(kohya: Path) -> None:
    (kohya / "cfg.toml").write_text('[saving]\nsave_state = true\nsave_every_n_steps = 50\n[model]\n'
                                    'pretrained_model_name_or_path = "model.safetensors"\n')
    findings, _ = run(kohya, "train_network.py", "--config_file", "cfg", "--train_data_dir", "data",
                      "--output_dir", "out")
    assert findings == []  # kohya appends .toml; save_state comes from the file


def test_no_resume_point_and_disk_space(kohya: Path) -> None:
    args = ("train_network.py", "--pretrained_model_name_or_path", "model.safetensors", "--train_data_dir", "data",
            "--output_dir", "out/deeper", "--network_dim", "32")
    findings, text = run(kohya, *args)
    assert findings == [("warning", "no_save_state")]
    findings, text = run(kohya, *args, "--save_state")
    assert findings == [("warning", "no_save_state")] and "only at the end" in text
    # 64x32 weight, dim 32: 32 * 96 fp32 values = 12 KiB trained; a state ~36 KiB; 3 states ~108 KiB.
    findings, text = run(kohya, *args, "--save_state", "--save_every_n_steps", "5", free=100 * 1024)
    assert findings == [("warning", "disk_space")]
    assert f"100.0 KiB free in {kohya}" in text and "a saved state is about 36.0 KiB" in text


def test_the_trainers_environment(kohya: Path) -> None:
    args = ("train_network.py", "--pretrained_model_name_or_path", "model.safetensors", *BASE)
    findings, text = run(kohya, *args, probe=versions(torch=None, accelerate=None))
    assert findings == [("blocker", "missing_package")] * 2
    assert f"{sys.executable} has no accelerate — fix: {sys.executable} -m pip install \"accelerate\"" in text
    report = doctor(["accelerate", "launch", "train_network.py"], kohya, {"PATH": str(kohya)},
                    gpu_probe=lambda: gpu.NullProbe("x"), disk_free=lambda _p: GIB)
    assert next(f.id for f in report.findings if f.severity == "blocker") == "launcher_not_found"
    assert report.exit_code == 2 and report.python is None


def test_a_command_no_adapter_knows_gets_the_interpreter_the_gpu_and_one_line_saying_so(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")
    findings, text = run(tmp_path, "train.py", "--lr", "1e-4")
    assert findings == []
    assert f"INFO python: {sys.executable}: torch 2.13.0" in text
    assert "INFO trainer: no adapter knows this command: trainsup supervises it without trainer knowledge" in text
    assert "INFO gpu: " in text and text.endswith("0 blocker(s), 0 warning(s)")
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\necho training\n")
    script.chmod(0o755)
    report = doctor([str(script)], tmp_path, {"PATH": "/usr/bin:/bin"}, gpu_probe=lambda: gpu.NullProbe("x"),
                    probe=versions(), disk_free=lambda _p: GIB)
    # a shell script names no python: that is information here, where no check needs its packages
    assert [(f.severity, f.id) for f in report.findings] == [("info", "python_unknown"), ("info", "trainer"),
                                                              ("info", "gpu")]
    assert report.exit_code == 0 and report.python is None


def test_a_command_without_data_loader_workers_is_told_its_resume_is_not_bit_exact(kohya: Path) -> None:
    argv = ["train_network.py", "--pretrained_model_name_or_path", "model.safetensors", *BASE]
    _findings, text = run(kohya, *argv, "--max_data_loader_n_workers", "0")
    assert "INFO inexact_resume: --max_data_loader_n_workers 0: after a resume" in text
    _findings, text = run(kohya, *argv, "--max_data_loader_n_workers", "2")
    assert "inexact_resume" not in text
    notes = prepare([sys.executable, *argv, "--max_data_loader_n_workers", "0"], kohya,
                    Policy().trainer_settings()).notes
    assert any("resumed run's weights differ slightly" in n for n in notes)
    notes = prepare([sys.executable, *argv], kohya, Policy().trainer_settings()).notes
    assert any("--save_every_n_epochs 1" in n for n in notes) and not any("differ slightly" in n for n in notes)


def test_a_script_whose_states_hold_no_step_is_told_it_starts_over_and_gets_no_saves_of_trainsups(
        kohya: Path) -> None:
    """sd-scripts' textual inversion (and its full fine-tunes) save no train_state.json: a resume counts from
    step 0 again, so trainsup adds no state or epoch save of its own and says the run starts over."""
    argv = ["train_textual_inversion.py", "--pretrained_model_name_or_path", "model.safetensors", *BASE]
    prepared = prepare([sys.executable, *argv], kohya, Policy().trainer_settings())
    assert any("train_textual_inversion.py saves no train_state.json" in n and "starts this run over" in n
               for n in prepared.notes), prepared.notes
    argv_after = prepared.plan.command.argv()
    assert "--save_every_n_epochs" not in argv_after
    lora = prepare([sys.executable, "train_network.py", *argv[1:]], kohya, Policy().trainer_settings())
    assert "--save_every_n_epochs" in lora.plan.command.argv()
