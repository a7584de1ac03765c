"""`trainsup run` over the real LitGPT trainer (litgpt 0.5.13 on the CPU): an exact resume of
``finetune_full`` after a SIGKILL, a LoRA run whose LR schedule divides by zero, a clean LoRA run,
and states cut mid-save that are never resumed from.

The user's command is passed unchanged; every assertion is about what the real trainer printed
and wrote. Runs are short (20 steps, a state every 5): about 10-30 s each on two cores.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import diagnose_json as diagnose
from tests.e2e.demo_harness import assert_untouched, digest_tree, supervise
from tests.real_litgpt.bed import KillAtLine, LitBed, trainer_process

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n"
EXACT = 1e-6  # the bed's resumes were bit-identical (0); allow float noise, nothing more




def ledger(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "ledger.json").read_text())
    return data


@pytest.fixture(scope="module")
def full_reference(litgpt_bed: LitBed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``final/lit_model.pth`` of an uninterrupted ``finetune_full`` run, without trainsup."""
    out = tmp_path_factory.mktemp("reference") / "out"
    done = litgpt_bed.run_plain(litgpt_bed.command("finetune_full", out))
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "final" / "lit_model.pth"


def kill_at_state(bed: LitBed, method: str, step: int, after: Any = None) -> tuple[Any, dict[str, str]]:
    """An ``on_event`` hook: SIGKILL the trainer right after trainsup journals its state at ``step``."""
    before: dict[str, str] = {}

    def hook(event: dict[str, Any]) -> None:
        if event["event"] == "state_saved" and event["step"] == step and not before:
            trainer = trainer_process(bed.litgpt, method)
            assert trainer is not None, f"no `litgpt {method}` process under trainsup"
            os.kill(trainer.pid, signal.SIGKILL)
            before.update(digest_tree(Path(event["dir"]).parent))
            if after is not None:
                after()

    return hook, before


def test_a_killed_finetune_full_resumes_from_its_step_10_state_and_ends_as_an_uninterrupted_run(
        litgpt_bed: LitBed, full_reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    hook, before_kill = kill_at_state(litgpt_bed, "finetune_full", 10)
    run = supervise(litgpt_bed.command("finetune_full", out), out, tmp_path, env=litgpt_bed.env(), policy=POLICY,
                    on_event=hook, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert before_kill and "step-000010/lit_model.pth" in before_kill
    assert [f["class"] for f in run.of("fault")] == ["host_oom_killed"]
    assert run.of("attempt_end")[0]["signal"] == 9
    start = run.of("attempt_start")[-1]
    newest = out / "step-000010"
    assert (start["attempt"], start["resume_from"], start["resume_step"]) == (2, str(newest), 10)
    argv = start["argv"]
    assert argv[argv.index("--resume") + 1] == str(newest / "lit_model.pth") and "auto" not in argv
    log = (run.run_dir / "attempt-2.log").read_text(encoding="utf-8", errors="replace")
    assert f"Resuming training from {newest / 'lit_model.pth'}" in log and "iter 11 step 11" in log
    # What was complete at the kill is untouched; a later folder (if the kill left one) was set aside.
    now = digest_tree(out)
    for rel in ("step-000005/lit_model.pth", "step-000010/lit_model.pth"):
        assert now[rel] == before_kill[rel], rel
    for aside in run.of("state_set_aside"):
        assert Path(aside["to"]).is_relative_to(run.run_dir / "set-aside") and aside["step"] > 10
    steps = [(s["step"], s["attempt"]) for s in ledger(run.run_dir)["states"]]
    assert (10, 1) in steps and (20, 2) in steps
    assert run.of("finished")[0]["final_weights"] == str(out / "final")
    assert litgpt_bed.max_abs_diff(out / "final" / "lit_model.pth", full_reference) <= EXACT


def test_a_lora_lr_schedule_that_divides_by_zero_restarts_fresh_with_a_valid_warmup_and_overwrites_nothing(
        litgpt_bed: LitBed, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = litgpt_bed.command("finetune_lora", out, "--train.lr_warmup_steps", "20")
    run = supervise(argv, out, tmp_path, env=litgpt_bed.env(), policy=POLICY, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (fault,) = run.of("fault")
    assert fault["class"] == "lr_schedule" and "ZeroDivisionError" in fault["evidence"]
    (remedy,) = run.of("remedy")
    assert remedy["actions"][0].startswith("--train.lr_warmup_steps 19 (was 20")
    first, second = run.of("attempt_start")
    assert first["argv"] == argv  # the user's command, unchanged
    own = run.run_dir / "attempt-2-out"
    a2 = second["argv"]
    assert second["resume_from"] is None and "--resume" not in a2
    assert a2[a2.index("--train.lr_warmup_steps") + 1] == "19" and a2[a2.index("--out_dir") + 1] == str(own)
    # the first attempt's step folders (LitGPT rewrites them in place, file by file) never changed
    assert {"step-000005/lit_model.pth.lora", "step-000015/prompt_style.yaml"} <= set(run.at_first_fault)
    assert_untouched(run, out)
    # The first attempt died at its 20th step; the fresh start's step-000020 (which out lacked) is
    # published from its own out dir as hard links, its earlier folders left where out has them.
    assert (out / "step-000020" / "lit_model.pth.lora").samefile(own / "step-000020" / "lit_model.pth.lora")
    assert [Path(e["dst"]).name for e in run.of("save_published")] == ["step-000020"]
    assert run.of("finished")[0]["final_weights"] == str(out / "final")
    assert (out / "final" / "lit_model.pth").stat().st_size > 0  # LoRA's merged weights, published
    assert (out / "final" / "lit_model.pth").samefile(own / "final" / "lit_model.pth")  # a hard link
    assert [e["dst"] for e in run.of("final_published")] == [str(out / "final")]


def test_a_clean_lora_run_finishes_with_no_fault_and_diagnose_agrees(litgpt_bed: LitBed, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = supervise(litgpt_bed.command("finetune_lora", out), out, tmp_path, env=litgpt_bed.env(), policy=POLICY,
                    timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not run.of("fault") and len(run.of("attempt_start")) == 1
    assert "finetune_lora cannot resume" in run.stderr  # said at start
    assert [s["step"] for s in ledger(run.run_dir)["states"]] == [5, 10, 15, 20]
    assert run.of("finished")[0]["final_weights"] == str(out / "final")
    assert (out / "final" / "lit_model.pth.lora").is_file()
    clean = diagnose(run.run_dir / "attempt-1.log")
    assert clean["fault"] is None, clean


def test_a_lora_state_cut_at_its_save_line_is_never_taken_for_a_state(litgpt_bed: LitBed, tmp_path: Path) -> None:
    # Killed the instant `iter 15 step 15` is logged (the save follows that line). What is left
    # depends on timing: no step-000015 yet, a 0-byte lit_model.pth.lora, or the weights without
    # hyperparameters.yaml/prompt_style.yaml (the bed README saw the last two). Where the kill left
    # no folder, the test truncates one into the README's shape, a 0-byte lit_model.pth.lora.
    out = tmp_path / "out"
    cut = out / "step-000015"
    left: list[str] = []  # what the kill itself left, for the failure message

    def cut_shape() -> None:
        weights = cut / "lit_model.pth.lora"
        left.append(f"{weights.stat().st_size}-byte weights" if weights.exists() else "no weights")
        if not weights.exists():
            cut.mkdir(parents=True, exist_ok=True)
            weights.write_bytes(b"")

    killer = KillAtLine(out / ".trainsup" / "attempt-1.log", "| iter 15 step 15 |", litgpt_bed.litgpt,
                        "finetune_lora", after=cut_shape)
    killer.start()
    try:
        run = supervise(litgpt_bed.command("finetune_lora", out), out, tmp_path, env=litgpt_bed.env(),
                        policy=POLICY, timeout=600)
    finally:
        killer.join(timeout=30)
    assert killer.killed and run.returncode == 0, run.stderr[-3000:]
    # The cut folder is moved aside as the kill left it, and the fresh start's complete step-000015
    # published in its place (the out dir then lists what an uninterrupted run writes).
    aside = [Path(e["to"]) for e in run.of("state_set_aside") if e["dir"] == str(cut)]
    assert run.at_first_fault and aside and not (aside[0] / "prompt_style.yaml").exists(), \
        (left, sorted(run.at_first_fault))
    assert (cut / "prompt_style.yaml").is_file()
    assert [(s["step"], s["attempt"]) for s in ledger(run.run_dir)["states"] if s["attempt"] == 1] == [(5, 1), (10, 1)]
    start = run.of("attempt_start")[-1]
    assert start["resume_from"] is None  # LoRA cannot resume: a fresh start, in an out dir of its own
    assert start["argv"][start["argv"].index("--out_dir") + 1] == str(run.run_dir / "attempt-2-out")
    assert_untouched(run, out)  # the cut folder's files are whole where it was moved
    assert (out / "final" / "lit_model.pth").is_file()


def test_a_full_state_whose_weights_were_cut_to_0_bytes_is_never_resumed_from(
        litgpt_bed: LitBed, full_reference: Path, tmp_path: Path) -> None:
    # The newest state's weights truncated right after the kill (what a save cut short leaves where
    # the weights are written in place): `--resume auto` would take it and die; trainsup resumes
    # from the state before it, and the run still ends exactly as an uninterrupted one.
    out = tmp_path / "out"
    hook, _before = kill_at_state(litgpt_bed, "finetune_full", 10,
                                  after=lambda: (out / "step-000010" / "lit_model.pth").write_bytes(b""))
    run = supervise(litgpt_bed.command("finetune_full", out), out, tmp_path, env=litgpt_bed.env(), policy=POLICY,
                    on_event=hook, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    start = run.of("attempt_start")[-1]
    assert (start["resume_from"], start["resume_step"]) == (str(out / "step-000005"), 5)
    assert start["argv"][start["argv"].index("--resume") + 1] == str(out / "step-000005" / "lit_model.pth")
    aside = {Path(e["dir"]).name: Path(e["to"]) for e in run.of("state_set_aside")}
    assert aside["step-000010"].joinpath("lit_model.pth").stat().st_size == 0  # moved, never deleted
    assert str(aside["step-000010"]) in ledger(run.run_dir)["bad_states"]
    assert litgpt_bed.max_abs_diff(out / "final" / "lit_model.pth", full_reference) <= EXACT
