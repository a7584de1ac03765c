"""Validation of saved states against real safetensors files, and the NaN check on weights."""

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from trainsup.adapters.kohya.states import check_state, state_dirs
from trainsup.adapters.kohya.weights import has_non_finite


def make_state(path: Path, step: int = 10, weights: np.ndarray | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "train_state.json").write_text(json.dumps({"current_epoch": 3, "current_step": step}))
    save_file({"lora.down": np.ones((4, 4), np.float32) if weights is None else weights},
              str(path / "model.safetensors"))
    for name in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
        (path / name).write_bytes(b"x" * 16)
    return path


def test_complete_state_is_accepted_with_its_step(tmp_path: Path) -> None:
    check = check_state(make_state(tmp_path / "lora-step00000010-state"))
    assert check.ok and check.label_step == 10 and check.epoch == 3


def test_half_written_states_are_rejected_with_a_reason(tmp_path: Path) -> None:
    s = make_state(tmp_path / "a-step00000005-state")
    (s / "random_states_0.pkl").unlink()  # the last file never came
    assert check_state(s).reason == "random_states_0.pkl missing or empty"

    t = make_state(tmp_path / "b-step00000005-state")
    data = (t / "model.safetensors").read_bytes()
    (t / "model.safetensors").write_bytes(data[:-10])  # tensor data cut short
    assert "truncated" in check_state(t).reason

    u = make_state(tmp_path / "c-step00000005-state")
    (u / "model.safetensors").write_bytes(b"\xff" * 64)  # garbage header
    assert not check_state(u).ok

    v = make_state(tmp_path / "d-step00000005-state")
    (v / "train_state.json").write_text("{not json")
    assert "train_state.json" in check_state(v).reason

    w = make_state(tmp_path / "e-step00000005-state")
    assert check_state(w, need_scaler=True).reason == "scaler.pt missing or empty"


def test_state_dirs_filters_by_output_name(tmp_path: Path) -> None:
    for name in ("x-step00000001-state", "x-000002-state", "x-state", "y-step00000003-state"):
        (tmp_path / name).mkdir()
    (tmp_path / "x-step00000004.safetensors").write_bytes(b"")
    found = [p.name for p in state_dirs(tmp_path, {"x"})]
    assert found == ["x-000002-state", "x-state", "x-step00000001-state"]


def test_non_finite_weights_are_found(tmp_path: Path) -> None:
    good = make_state(tmp_path / "g-step00000001-state")
    bad = make_state(tmp_path / "b-step00000002-state", weights=np.array([1.0, np.nan], np.float32))
    assert not has_non_finite(good / "model.safetensors")
    assert has_non_finite(bad / "model.safetensors")
