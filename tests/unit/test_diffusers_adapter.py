"""The accelerate ``checkpoint-N`` scripts (diffusers' examples) as their own family (issue 33): claimed
by script name or by flags no other trainer takes, never kohya's and never claiming kohya's; complete
checkpoints only (accelerate's files, the last one written included, safetensors whole, no write cut
short); the resume names the chosen checkpoint by its last component and sets aside what lies past it;
the user's ``latest`` is the newest complete one; a finished run is never resumed; the epoch-end
preference; ``--checkpoints_total_limit 1`` raised; the output lines of the real bed; remedies and doctor
in the script's flags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.contract.kit import launched
from trainsup.adapters.diffusers.adapter import FAMILY, DiffusersRun
from trainsup.adapters.diffusers.output import DiffusersOutput, steps_per_epoch
from trainsup.adapters.diffusers.states import state_problem
from trainsup.faults.remedies import Action
from trainsup.record.journal import Journal
from trainsup.record.ledger import Ledger
from trainsup.trainers.base import NAMES_SCRIPT, NO_CLAIM, TELLTALE, Setup, UsageError
from trainsup.trainers.registry import choose, families

BED = "/bed"
# the real beds' commands, as their tiers type them
DIFFUSERS_BED = [f"{BED}/venv/bin/accelerate", "launch",
                 f"{BED}/diffusers/examples/text_to_image/train_text_to_image_lora.py",
                 "--pretrained_model_name_or_path", f"{BED}/model/tiny-sd",
                 "--train_data_dir", f"{BED}/data/train", "--resolution", "64", "--center_crop", "--random_flip",
                 "--train_batch_size", "1", "--max_train_steps", "20", "--checkpointing_steps", "5",
                 "--learning_rate", "1e-04", "--lr_scheduler", "constant", "--lr_warmup_steps", "0", "--seed", "42",
                 "--output_dir", "out"]
SD_SCRIPTS_BED = [f"{BED}/venv/bin/accelerate", "launch", "--config_file", f"{BED}/accel.yaml",
                  "--num_cpu_threads_per_process", "2", "train_network.py", "--pretrained_model_name_or_path",
                  f"{BED}/model", "--tokenizer_cache_dir", f"{BED}/model/tokenizer_cache", "--dataset_config",
                  f"{BED}/data/dataset.toml", "--output_dir", "out", "--output_name", "tiny", "--save_model_as",
                  "safetensors", "--network_module", "networks.lora", "--network_dim", "4", "--network_alpha", "1",
                  "--optimizer_type", "AdamW", "--learning_rate", "1e-4", "--lr_scheduler", "constant",
                  "--max_train_steps", "20", "--save_every_n_steps", "5", "--save_state", "--mixed_precision", "no",
                  "--save_precision", "float", "--max_data_loader_n_workers", "0", "--seed", "42"]


# --- claims --------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    DIFFUSERS_BED,
    "accelerate launch train_dreambooth_lora.py --pretrained_model_name_or_path m --instance_data_dir d".split(),
    "accelerate launch train_dreambooth_lora_sdxl.py --output_dir o".split(),
    "python examples/controlnet/train_controlnet.py --output_dir o".split(),
    "accelerate launch textual_inversion.py --output_dir o".split(),
])
def test_diffusers_scripts_are_claimed_by_name_and_never_by_kohya(argv: list[str]) -> None:
    assert FAMILY.detect(argv) == NAMES_SCRIPT
    assert families()["kohya"].detect(argv) == NO_CLAIM
    assert choose(argv).name == "diffusers"


def test_a_look_alike_script_is_claimed_by_its_checkpoint_flags_only() -> None:
    assert FAMILY.detect("python mine.py --output_dir o --checkpointing_steps 100".split()) == TELLTALE
    assert FAMILY.detect("python mine.py --output_dir o --checkpoints_total_limit 2".split()) == TELLTALE
    assert FAMILY.detect("python mine.py --output_dir o --resume_from_checkpoint latest".split()) == TELLTALE
    # a path to resume from alone is every Trainer script's flag too: no claim
    assert FAMILY.detect("python mine.py --output_dir o --resume_from_checkpoint o/checkpoint-5".split()) == NO_CLAIM
    assert FAMILY.detect("python train.py --epochs 3".split()) == NO_CLAIM


@pytest.mark.parametrize("argv", [
    SD_SCRIPTS_BED,
    "accelerate launch sdxl_train_network.py --output_dir o".split(),
    "python train_textual_inversion.py --output_dir o".split(),
    "accelerate launch src/musubi_tuner/wan_train_network.py --task t2v-1.3B".split(),
    "python my_lora_script.py --pretrained_model_name_or_path m --output_dir o".split(),
])
def test_kohya_and_musubi_commands_are_never_claimed(argv: list[str]) -> None:
    assert FAMILY.detect(argv) == NO_CLAIM
    assert choose(argv).name in ("kohya", "musubi")


# --- output --------------------------------------------------------------------------------------
def test_the_real_beds_lines() -> None:
    out = DiffusersOutput()
    p = out.progress("Steps:  50%|█████     | 10/20 [00:08<00:04,  2.18it/s, lr=0.0001, step_loss=1.2]")
    assert p is not None and (p.step, p.total, p.rate, p.loss) == (10, 20, 2.18, 1.2)
    slow = out.progress("Steps:   5%|▌         | 1/20 [00:03<01:00,  3.20s/it, lr=0.0001, step_loss=0.031]")
    assert slow is not None and slow.rate == pytest.approx(1 / 3.2)
    glued = ("Steps:  50%|█████     | 10/20 [00:00<00:00, 17.68it/s, lr=0.0001, step_loss=1.2]11/26/2026 14:36:12 - "
             "INFO - accelerate.accelerator - [RANK 0] Saving current state to out/checkpoint-10")
    assert out.state_started(glued) == 10 and out.progress(glued) is not None
    assert out.state_completed("11/26/2026 14:36:12 - INFO - __main__ - [RANK 0] Saved state to out/checkpoint-10") \
        is not None
    assert out.state_completed("Model weights saved in out/checkpoint-10/pytorch_lora_weights.safetensors") is None
    facts: dict[str, int] = {}
    for line in ("  Num examples = 8", "  Num Epochs = 3", "  Instantaneous batch size per device = 1",
                 "  Total train batch size (w. parallel, distributed & accumulation) = 1",
                 "  Gradient Accumulation steps = 1", "  Total optimization steps = 20"):
        s = out.summary("11/26/2026 14:33:41 - INFO - __main__ - [RANK 0] " + line)
        if s is not None:
            facts.update(s.facts)
    assert steps_per_epoch(facts) == 8
    assert steps_per_epoch({"examples": 9, "batch": 2, "grad_accum": 2, "total_batch": 8}) == 2  # 3 batches a process
    assert steps_per_epoch({"examples": 9, "batch": 2, "grad_accum": 1, "total_batch": 2}) == 5


# --- states --------------------------------------------------------------------------------------
def make_state(out: Path, step: int, *, last: bool = True) -> Path:
    state = out / f"checkpoint-{step}"
    state.mkdir(parents=True)
    save_file({"unet.lora_A.weight": np.ones((2, 2), np.float32)}, str(state / "pytorch_lora_weights.safetensors"))
    for part in ("optimizer.bin", "scheduler.bin", *(("random_states_0.pkl",) if last else ())):
        (state / part).write_bytes(b"x")
    return state


def test_a_checkpoint_is_complete_only_with_every_file_and_whole_weights(tmp_path: Path) -> None:
    state = make_state(tmp_path, 10)
    assert state_problem(state) == ""
    assert "random_states_1.pkl" in state_problem(state, processes=2)
    (state / ".tmpab12cd").write_bytes(b"")
    assert "cut short" in state_problem(state)
    (state / ".tmpab12cd").unlink()
    weights = state / "pytorch_lora_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4])
    assert "truncated" in state_problem(state)
    assert "random_states_0.pkl" in state_problem(make_state(tmp_path, 5, last=False))


def open_bound(tmp: Path, *extra: str) -> tuple[DiffusersRun, Path, Ledger]:
    run = FAMILY.open(Setup(tuple(DIFFUSERS_BED + list(extra)), tmp))
    assert isinstance(run, DiffusersRun)
    run_dir = tmp / "out" / ".trainsup"
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(run_dir / "ledger.json")
    run.bind(run_dir, ledger, Journal(run_dir), lambda _m: None)
    return run, run_dir, ledger


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_latest_is_the_newest_complete_checkpoint_named_and_what_lies_past_it_is_set_aside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    make_state(out, 5)
    make_state(out, 10, last=False)  # cut mid-save: the script's own `latest` would load it
    run, run_dir, _ledger = open_bound(tmp_path, "--resume_from_checkpoint", "latest")
    assert run.user_resume == out / "checkpoint-5"
    assert run.states.adopt(out / "checkpoint-5") == ""
    resume = run.states.newest(plan=run.plan)
    assert resume is not None and resume.step == 5
    argv = launched(run, run.plan.copy(), 1, resume, run_dir)
    assert _value(argv, "--resume_from_checkpoint") == "checkpoint-5"  # the script joins it with --output_dir
    assert not (out / "checkpoint-10").exists()
    aside = run_dir / "set-aside" / "attempt-1" / "checkpoint-10"
    assert aside.is_dir() and not aside.name.startswith(".")  # kept, out of the script's listing
    # a fresh attempt runs without the flag, and with the earlier attempts' checkpoints out of the way
    argv = launched(run, run.plan.copy(), 2, None, run_dir)
    assert "--resume_from_checkpoint" not in argv and not list(out.glob("checkpoint-*"))


def test_a_finished_run_is_never_resumed_into_one_more_step(tmp_path: Path) -> None:
    out = tmp_path / "out"
    make_state(out, 15)
    make_state(out, 20)
    with pytest.raises(UsageError, match="this run is finished"):
        FAMILY.open(Setup(tuple(DIFFUSERS_BED + ["--resume_from_checkpoint", "latest"]), tmp_path))
    run, _run_dir, _ledger = open_bound(tmp_path)
    run.states.begin(1, run.launch(run.plan.copy(), 1, None, tmp_path / "out" / ".trainsup"))
    # a fault after the last checkpoint, before the final weights: one checkpoint earlier, never step 20
    for step in (15, 20):
        assert run.states.adopt(out / f"checkpoint-{step}") == ""
    resume = run.states.newest(max_steps=20, plan=run.plan)
    assert resume is not None and resume.step == 15


def test_the_newest_epoch_end_within_two_checkpoint_intervals_is_preferred(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, run_dir, ledger = open_bound(tmp_path, "--checkpointing_steps", "4")
    launched(run, run.plan.copy(), 1, None, run_dir)
    run.on_summary({"examples": 8, "batch": 1, "total_batch": 1, "grad_accum": 1, "max_steps": 20})
    assert ledger.attempts[0].notes["per_epoch"] == 8
    for step in (4, 8, 12):
        make_state(out, step)
    run.states.collect()
    resume = run.states.newest(max_steps=20, plan=run.plan)
    assert resume is not None and resume.step == 8  # 12 is mid-epoch; 8 ends epoch 1
    make_state(out, 20 + 4)  # 24 is an epoch end: the newest, taken as it is
    run.states.collect()
    resume = run.states.newest(max_steps=40, plan=run.plan)
    assert resume is not None and resume.step == 24


def test_the_runs_own_start_counts_as_an_epoch_end_but_not_too_far_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, run_dir, _ledger = open_bound(tmp_path)  # a checkpoint every 5, 8 steps an epoch
    launched(run, run.plan.copy(), 1, None, run_dir)
    run.on_summary({"examples": 8, "batch": 1, "grad_accum": 1})
    for step in (5, 10):
        make_state(out, step)
    run.states.collect()
    assert run.states.newest(max_steps=20, plan=run.plan) is None  # a fresh start: exact
    make_state(out, 15)
    run.states.collect()
    resume = run.states.newest(max_steps=20, plan=run.plan)
    assert resume is not None and resume.step == 15  # step 0 is three intervals back


# --- the first plan ------------------------------------------------------------------------------
def test_checkpoints_total_limit_1_is_raised_to_2_and_a_cadence_is_set_when_none_would_save(tmp_path: Path) -> None:
    run = FAMILY.open(Setup(tuple(DIFFUSERS_BED + ["--checkpoints_total_limit", "1"]), tmp_path))
    argv = run.command_line(run.plan)
    assert _value(argv, "--checkpoints_total_limit") == "2" and any("raised to 2" in n for n in run.notes)
    run = FAMILY.open(Setup(tuple(DIFFUSERS_BED + ["--checkpoints_total_limit", "3"]), tmp_path))
    assert _value(run.command_line(run.plan), "--checkpoints_total_limit") == "3" and not run.notes
    plain = [a for a in DIFFUSERS_BED if a not in ("--checkpointing_steps", "5")]
    run = FAMILY.open(Setup(tuple(plain), tmp_path))
    assert _value(run.command_line(run.plan), "--checkpointing_steps") == "2"  # the default 500 saves none in 20
    with pytest.raises(UsageError, match="--output_dir"):
        FAMILY.open(Setup(tuple(DIFFUSERS_BED[:-2]), tmp_path))


def test_adding_latest_to_the_command_keeps_it_the_same_run(tmp_path: Path) -> None:
    a = FAMILY.open(Setup(tuple(DIFFUSERS_BED), tmp_path))
    b = FAMILY.open(Setup(tuple(DIFFUSERS_BED + ["--resume_from_checkpoint", "latest"]), tmp_path))
    a.given_argv, b.given_argv = tuple(DIFFUSERS_BED), tuple(DIFFUSERS_BED + ["--resume_from_checkpoint", "latest"])
    assert a.identity() == b.identity()


# --- remedies and doctor -------------------------------------------------------------------------
def test_memory_remedies_in_the_scripts_flags(tmp_path: Path) -> None:
    run = FAMILY.open(Setup(tuple(DIFFUSERS_BED), tmp_path))
    described = [rung.describe() for rung in run.ladder("cuda_oom")]
    assert any("gradient_checkpointing" in d for d in described)
    plan = run.plan.copy()
    assert run.apply(plan, Action("add_flag", "gradient_checkpointing")) == "add --gradient_checkpointing"
    assert "--gradient_checkpointing" in run.command_line(plan)
    assert run.apply(plan, Action("add_flag", "gradient_checkpointing")) is None
    assert run.apply(plan, Action("add_flag", "mixed_precision", "bf16")) == "add --mixed_precision bf16"
    assert run.apply(plan, Action("halve_batch")) is None  # batch 1: nothing to halve
    big = FAMILY.open(Setup(tuple(DIFFUSERS_BED + ["--train_batch_size", "4", "--mixed_precision", "fp16"]),
                          tmp_path))
    plan = big.plan.copy()
    assert big.apply(plan, Action("halve_batch")) == "--train_batch_size 2, --gradient_accumulation_steps 2"
    assert big.apply(plan, Action("add_flag", "mixed_precision", "bf16")) is None  # the user's precision stays
    assert big.apply(plan, Action("lower_workers", value="half")) is None  # the scripts' default: 0 workers


def test_doctor_blocks_a_name_the_scripts_latest_crashes_on_and_warns_of_limit_1(tmp_path: Path) -> None:
    (tmp_path / "out" / "checkpoint-10.bad").mkdir(parents=True)
    run = FAMILY.open(Setup(tuple(DIFFUSERS_BED + ["--checkpoints_total_limit", "1"]), tmp_path, as_given=True))
    found = {f.id: f for f in run.doctor({})}
    assert found["checkpoint_name"].severity == "blocker" and "checkpoint-10.bad" in found["checkpoint_name"].message
    assert found["checkpoints_total_limit"].severity == "warning"
    run = FAMILY.open(Setup(tuple(DIFFUSERS_BED + ["--resume_from_checkpoint", "/elsewhere/checkpoint-7"]),
                            tmp_path, as_given=True))
    assert {f.id for f in run.doctor({}) if f.severity == "blocker"} >= {"resume_missing"}


def test_a_flag_whose_package_is_missing_is_dropped_and_only_that_flag(tmp_path: Path) -> None:
    from trainsup.faults.verdict import Said
    from trainsup.trainers.base import rung_applies

    run = FAMILY.open(Setup(tuple(DIFFUSERS_BED + ["--enable_xformers_memory_efficient_attention",
                                                   "--use_8bit_adam"]), tmp_path))
    assert any(r.id == "flag_conflict" for r in run.rules())
    xformers = Said("ValueError: xformers is not available. Make sure it is installed correctly")
    rungs = [r for r in run.ladder("flag_conflict") if rung_applies(run, run.plan, r, xformers)]
    assert rungs[0].describe() == "remove --enable_xformers_memory_efficient_attention"
    bnb = Said("ImportError: Please install bitsandbytes to use 8-bit Adam. You can do so by running `pip install "
               "bitsandbytes`")
    rungs = [r for r in run.ladder("flag_conflict") if rung_applies(run, run.plan, r, bnb)]
    assert "remove --use_8bit_adam" in rungs[0].describe()
