"""musubi-tuner's ``--fp8_base`` alone, as its real CPU bed fails it (issue 31): the first step dies with
``mat1 and mat2 must have the same dtype, but got Float and Float8_e4m3fn`` (float8 weights met by a
float32 input that autocast did not cast). That reads as ``fp8_op_unsupported``, and musubi's ladder
first adds ``--fp8_scaled`` (its own dequantizing Linear forward, which trains there and keeps the
float8 memory saving), then turns float8 off."""

from __future__ import annotations

import functools
from pathlib import Path

from trainsup.adapters.musubi.adapter import MusubiRun
from trainsup.faults import scanner
from trainsup.faults.verdict import Said
from trainsup.trainers.base import Setup, rung_applies
from trainsup.trainers.registry import known_output

classify_text = functools.partial(scanner.classify_text, progress=known_output())
# The bed's lines (wan/modules/model.py, the time embedding under a float32 autocast the CPU refuses).
LINE = "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Float8_e4m3fn"
LOG = ["steps:   0%|          | 0/20 [00:00<?, ?it/s]Traceback (most recent call last):",
       '  File "/bed/musubi-tuner/src/musubi_tuner/wan/modules/model.py", line 851, in forward',
       "    e = self.time_embedding(sinusoidal_embedding_1d(self.freq_dim, t).float())",
       LINE]


def _run(tmp: Path, *extra: str) -> MusubiRun:
    argv = ("accelerate", "launch", "src/musubi_tuner/wan_train_network.py", "--task", "t2v-1.3B", "--sdpa",
            "--dit", "dit.safetensors", "--output_dir", str(tmp / "out"), "--output_name", "tiny", *extra)
    return MusubiRun(Setup(argv, tmp))


def test_float8_weights_meeting_a_float32_input_read_as_an_unsupported_float8_op() -> None:
    verdict = classify_text(LOG)
    assert verdict is not None and verdict.fault == "fp8_op_unsupported"
    assert classify_text([LINE.replace("Float and Float8_e4m3fn", "Float8_e4m3fn and BFloat16")]).fault == \
        "fp8_op_unsupported"
    # the dtype mismatch of a bf16 DiT (no float8 in it) is another fault, not this one
    other = classify_text(["RuntimeError: mat1 and mat2 must have the same dtype, but got Float and BFloat16"])
    assert other is None or other.fault != "fp8_op_unsupported"


def test_fp8_base_alone_gets_fp8_scaled_first_then_float8_off(tmp_path: Path) -> None:
    run = _run(tmp_path, "--fp8_base")
    said = Said(LINE)
    first, second = [r for r in run.ladder("fp8_op_unsupported") if rung_applies(run, run.plan, r, said)][:2]
    plan = run.plan.copy()
    for action in first.actions:
        run.apply(plan, action, said)
    assert plan.command.has("fp8_base") and plan.command.has("fp8_scaled")
    assert {(a.kind, a.name) for a in second.actions} == {("remove_flag", "fp8_base"), ("remove_flag", "fp8_scaled")}
    # with --fp8_scaled already there, or for another float8 wording, float8 goes off at once
    scaled = _run(tmp_path, "--fp8_base", "--fp8_scaled")
    fits = [r for r in scaled.ladder("fp8_op_unsupported") if rung_applies(scaled, scaled.plan, r, said)]
    assert {a.name for a in fits[0].actions} == {"fp8_base", "fp8_scaled"} and fits[0].actions[0].kind == "remove_flag"
    kernel = Said("RuntimeError: \"addmm_cpu\" not implemented for 'Float8_e4m3fn'")
    fits = [r for r in run.ladder("fp8_op_unsupported") if rung_applies(run, run.plan, r, kernel)]
    assert fits[0].actions[0].kind == "remove_flag"
