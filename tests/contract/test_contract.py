"""The contract every registered trainer family keeps (``trainers.base``), one parametrized set of
tests for all of them: a new adapter passes these once its row is in ``CASES`` below.

A family claims its own example commands (on the claim scale) and not the other families'; its
launch is a ``Launch`` with a sane argv and environment for a fresh start; it resumes from a state
made in a temporary directory (its resume step and the state's path in the argv); every rung of
every ladder it has, applied to a copy of the plan, leaves the original plan and the session alone;
and it works before ``bind`` and without one (a default state store that knows no state).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.contract.kit import launched
from trainsup.faults.classes import FAULT_CLASSES
from trainsup.faults.rules import BUILTIN_RULES, FAULT_IDS
from trainsup.faults.verdict import NOTHING_SAID
from trainsup.record.journal import Journal
from trainsup.record.ledger import Ledger
from trainsup.trainers.base import (
    ANY_COMMAND,
    NAMES_SCRIPT,
    Launch,
    NoStates,
    Setup,
    TrainerRun,
)
from trainsup.trainers.registry import choose, families, family_rules, open_run

# The diffusers example script's command (states in out/checkpoint-N/): the diffusers family names it, and
# kohya's telltale --pretrained_model_name_or_path must not claim it (its argparse refuses kohya's flags).
DIFFUSERS = ("accelerate launch train_dreambooth_lora.py --pretrained_model_name_or_path M "
             "--instance_data_dir dog --output_dir out --checkpointing_steps 500 --resume_from_checkpoint latest")


@dataclass
class Case:
    """A family's examples: commands it claims, how to open a run of it, how to make a state of it."""

    claims: tuple[str, ...]  # commands (split on spaces) this family claims
    setup: Callable[[Path], Setup]  # a command it can open in a temporary directory
    # A complete saved state of that run, made on disk: (its directory, its true step); None: no states.
    state: Callable[[Path, TrainerRun], tuple[Path, int]] | None = None
    trainer: str | dict[str, Any] | None = None  # what a project's trainer: names (the declarative one)
    # Whether a launch resumes from the state at this path (default: the path is in its argv).
    resumes: Callable[[Launch, Path], bool] = lambda launch, state: any(str(state) in a for a in launch.argv)


# --- kohya ---------------------------------------------------------------------------------------
def _kohya_setup(tmp: Path) -> Setup:
    return Setup(("accelerate", "launch", "train_network.py", "--output_dir", str(tmp / "out"), "--output_name",
                  "tiny", "--max_train_steps", "20", "--save_every_n_steps", "5", "--network_module",
                  "networks.lora"), tmp)


def _kohya_state(tmp: Path, run: TrainerRun) -> tuple[Path, int]:
    state = tmp / "out" / "tiny-step00000010-state"
    state.mkdir(parents=True)
    (state / "train_state.json").write_text(json.dumps({"current_epoch": 1, "current_step": 10}))
    save_file({"lora.down": np.ones((2, 2), np.float32)}, str(state / "model.safetensors"))
    for part in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
        (state / part).write_bytes(b"x")
    return state, 10


# --- musubi --------------------------------------------------------------------------------------
def _musubi_setup(tmp: Path) -> Setup:
    return Setup(("accelerate", "launch", "src/musubi_tuner/wan_train_network.py", "--task", "t2v-1.3B", "--sdpa",
                  "--output_dir", str(tmp / "out"), "--output_name", "tiny", "--max_train_steps", "20",
                  "--save_every_n_steps", "5", "--save_state", "--network_module", "networks.lora_wan"), tmp)


def _musubi_state(tmp: Path, run: TrainerRun) -> tuple[Path, int]:
    """musubi's state: accelerate's files alone, no train_state.json (its step is in the name)."""
    state = tmp / "out" / "tiny-step00000010-state"
    state.mkdir(parents=True)
    save_file({"lora.down": np.ones((2, 2), np.float32)}, str(state / "model.safetensors"))
    for part in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
        (state / part).write_bytes(b"x")
    return state, 10


# --- litgpt --------------------------------------------------------------------------------------
def _litgpt_setup(tmp: Path) -> Setup:
    return Setup(("litgpt", "finetune_full", "checkpoints/pythia", "--out_dir", str(tmp / "out"),
                  "--train.max_steps", "20", "--train.save_interval", "5"), tmp)


def _litgpt_state(tmp: Path, run: TrainerRun) -> tuple[Path, int]:
    from tests.unit.test_litgpt_adapter import state
    return state(tmp / "out", 10, "lit_model.pth"), 10


# --- onetrainer ----------------------------------------------------------------------------------
def _onetrainer_setup(tmp: Path) -> Setup:
    from tests.unit.test_onetrainer_adapter import argv, config
    return Setup(tuple(argv(config(tmp))), tmp)


def _onetrainer_state(tmp: Path, run: TrainerRun) -> tuple[Path, int]:
    from tests.unit.test_onetrainer_adapter import backup
    return backup(tmp / "ws", 4, 0, 4), 4


def _onetrainer_resumes(launch: Launch, state: Path) -> bool:
    """OneTrainer resumes from the newest backup in backup/ when its config says so (the derived one)."""
    config = Path(launch.argv[launch.argv.index("--config-path") + 1])
    newest = max(p.name for p in state.parent.iterdir())
    return json.loads(config.read_text())["continue_last_backup"] is True and newest == state.name


# --- hf (the Hugging Face Trainer) ---------------------------------------------------------------
def _hf_setup(tmp: Path) -> Setup:
    return Setup(("trl", "sft", "--model_name_or_path", "m", "--output_dir", str(tmp / "out"), "--max_steps", "20",
                  "--save_steps", "5"), tmp)


def _hf_state(tmp: Path, run: TrainerRun) -> tuple[Path, int]:
    from tests.unit.test_hf_adapter import checkpoint
    return checkpoint(tmp / "out", 10, 20), 10


# --- declarative ---------------------------------------------------------------------------------
SECTION = {"states": "out/checkpoint-*", "complete": "state.json",
           "resume": ["--resume_from_checkpoint", "{state}"]}


def _declarative_setup(tmp: Path) -> Setup:
    return Setup(("python", "train.py", "--output_dir", "out"), tmp, section=SECTION)


def _declarative_state(tmp: Path, run: TrainerRun) -> tuple[Path, int]:
    state = tmp / "out" / "checkpoint-10"
    state.mkdir(parents=True)
    (state / "state.json").write_text("{}")
    return state, 10


# --- diffusers -----------------------------------------------------------------------------------
def _diffusers_setup(tmp: Path) -> Setup:
    return Setup(("accelerate", "launch", "train_text_to_image_lora.py", "--pretrained_model_name_or_path", "m",
                  "--output_dir", str(tmp / "out"), "--max_train_steps", "20", "--checkpointing_steps", "5"), tmp)


def _diffusers_state(tmp: Path, run: TrainerRun) -> tuple[Path, int]:
    state = tmp / "out" / "checkpoint-10"
    state.mkdir(parents=True)
    save_file({"unet.lora_A.weight": np.ones((2, 2), np.float32)}, str(state / "pytorch_lora_weights.safetensors"))
    for part in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
        (state / part).write_bytes(b"x")
    return state, 10


def _diffusers_resumes(launch: Launch, state: Path) -> bool:
    # the script joins the name with --output_dir: only the last component is passed
    argv = list(launch.argv)
    return argv[argv.index("--resume_from_checkpoint") + 1] == state.name


CASES: dict[str, Case] = {
    "kohya": Case(("accelerate launch --num_cpu_threads_per_process 1 train_network.py --output_dir o",
                   "accelerate launch sdxl_train_network.py --output_dir o",
                   "python flux_train_network.py --output_dir o",
                   "python -m trainsup.demo.flux_train_network --output_dir o",
                   "python my_lora_script.py --pretrained_model_name_or_path m --output_dir o"),
                  _kohya_setup, _kohya_state),
    "musubi": Case(("accelerate launch --mixed_precision bf16 src/musubi_tuner/wan_train_network.py --task t2v-1.3B",
                    "python src/musubi_tuner/qwen_image_train_network.py --dit d",
                    "python -m musubi_tuner.hv_1_5_train_network --dit d",
                    "accelerate launch zimage_train.py --output_dir o"),
                   _musubi_setup, _musubi_state),
    "litgpt": Case(("litgpt finetune_lora checkpoints/pythia --out_dir o",
                    "python -m litgpt finetune_full checkpoints/pythia", "/venv/bin/litgpt pretrain pythia-14m"),
                   _litgpt_setup, _litgpt_state),
    "onetrainer": Case(("python scripts/train.py --config-path cfg.json",
                        "python /opt/OneTrainer/scripts/train.py --config-path=x.json"),
                       _onetrainer_setup, _onetrainer_state, resumes=_onetrainer_resumes),
    "diffusers": Case((DIFFUSERS, "accelerate launch examples/text_to_image/train_text_to_image_lora.py --output_dir o",
                       "python textual_inversion.py --output_dir o",
                       "python my_script.py --output_dir o --checkpointing_steps 100",
                       "python my_script.py --output_dir o --resume_from_checkpoint latest"),
                      _diffusers_setup, _diffusers_state, resumes=_diffusers_resumes),
    "hf": Case(("trl sft --model_name_or_path m --output_dir o", "python -m trl dpo --output_dir o",
                "axolotl train cfg.yml", "python -m axolotl.cli.train cfg.yml", "llamafactory-cli train cfg.yaml",
                "accelerate launch run_clm.py --model_name_or_path m --output_dir o --save_steps 500",
                ("torchrun --nproc_per_node 2 train.py --output_dir o --resume_from_checkpoint o/checkpoint-5 "
                 "--per_device_train_batch_size 4")),
               _hf_setup, _hf_state),
    "command": Case(("python train.py --epochs 3", "./train.sh"),
                    lambda tmp: Setup(("python", "train.py", "--out_dir", "runs/a"), tmp)),
    "declarative": Case((), _declarative_setup, _declarative_state, trainer=SECTION),
}


def test_every_registered_family_has_a_row_in_the_kit() -> None:
    assert set(families()) <= set(CASES), "add the new family's examples to CASES"


FAMILIES = sorted(CASES)


@pytest.fixture
def bound(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TrainerRun, Path, Ledger]]:
    """A run of the family opened in a temporary directory and bound to a run dir of its own."""
    name = request.param
    case = CASES[name]
    run = open_run(case.setup(tmp_path), case.trainer if case.trainer is not None else name)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    journal = Journal(run_dir)
    ledger = Ledger(run_dir / "ledger.json")
    run.bind(run_dir, ledger, journal, lambda _m: None)
    yield run, run_dir, ledger
    journal.close()


# --- detection -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FAMILIES)
def test_a_family_claims_its_own_examples_and_no_other_familys(name: str) -> None:
    for example in CASES[name].claims:
        argv = example.split()
        assert choose(argv).name == name, example
        for other, family in families().items():
            if other != name:
                assert family.detect(argv) < families()[name].detect(argv), (other, example)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_claim_is_a_step_of_the_claim_scale(name: str) -> None:
    family = families()[name]
    for case in CASES.values():
        for example in case.claims:
            assert family.detect(example.split()) in (0, ANY_COMMAND, 5, NAMES_SCRIPT), (name, example)


def test_a_diffusers_script_is_never_kohyas_even_with_its_telltale_flag() -> None:
    argv = DIFFUSERS.split()
    assert families()["kohya"].detect(argv) == 0
    assert choose(argv).name == "diffusers"  # the checkpoint-N family names the script
    renamed = "python my_lora_script.py --pretrained_model_name_or_path m --output_dir o".split()
    assert choose(renamed).name == "kohya"  # a renamed sd-scripts script still is kohya's by its flags


# --- launch --------------------------------------------------------------------------------------
@pytest.mark.parametrize("bound", FAMILIES, indirect=True)
def test_a_fresh_launch_is_a_value_and_the_store_hears_of_it_from_the_engine(
        bound: tuple[TrainerRun, Path, Ledger]) -> None:
    run, run_dir, ledger = bound
    plan = run.plan.copy()
    launch = run.launch(plan, 1, None, run_dir)
    assert isinstance(launch, Launch) and launch.resume_step == 0
    assert launch.argv and all(isinstance(a, str) and a for a in launch.argv)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in launch.env.items())
    assert not ledger.attempts  # launch itself enters nothing: the engine calls begin
    run.states.begin(1, launch)
    if not isinstance(run.states, NoStates):
        assert [a.attempt for a in ledger.attempts] == [1] and ledger.attempts[0].resume_step == 0


@pytest.mark.parametrize("bound", [n for n in FAMILIES if CASES[n].state is not None], indirect=True)
def test_an_attempt_resumes_from_a_state_with_its_step_and_its_path(
        bound: tuple[TrainerRun, Path, Ledger], tmp_path: Path) -> None:
    run, run_dir, _ledger = bound
    make = CASES[run.family].state
    assert make is not None
    launched(run, run.plan.copy(), 1, None, run_dir)
    path, step = make(tmp_path, run)
    assert run.states.adopt(path) == ""
    resume = run.states.newest(plan=run.plan)
    assert resume is not None and resume.step == step
    launch = run.launch(run.plan.copy(), 2, resume, run_dir)
    assert launch.resume_step == step
    assert CASES[run.family].resumes(launch, path), launch.argv


# --- remedies ------------------------------------------------------------------------------------
def _faults() -> list[str]:
    return sorted(set(FAULT_CLASSES) | set(FAULT_IDS) | {r.id for r in (*BUILTIN_RULES, *family_rules())})


@pytest.mark.parametrize("bound", FAMILIES, indirect=True)
def test_every_rung_applied_to_a_copy_leaves_the_plan_and_the_session_alone(
        bound: tuple[TrainerRun, Path, Ledger]) -> None:
    run, run_dir, _ledger = bound
    launched(run, run.plan.copy(), 1, None, run_dir)
    plan = run.plan.copy()
    before = repr(plan), run.command_line(plan)
    session = {k: repr(v) for k, v in vars(run).items()}
    tried = 0
    for fault in _faults():
        for rung in run.ladder(fault, plan):
            for action in rung.actions:
                trial = plan.copy()
                try:
                    run.apply(trial, action, NOTHING_SAID)
                except (ValueError, OSError):
                    continue
                tried += 1
                assert (repr(plan), run.command_line(plan)) == before, (fault, action)
                assert {k: repr(v) for k, v in vars(run).items()} == session, (fault, action)
    assert tried


# --- no bind -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FAMILIES)
def test_a_session_has_a_state_store_before_bind_that_knows_no_state(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    run = open_run(case.setup(tmp_path), case.trainer if case.trainer is not None else name)
    assert run.states.newest() is None and run.states.collect() == [] and run.states.steps_proven() == 0
