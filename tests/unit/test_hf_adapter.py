"""The Hugging Face Trainer family (``adapters/hf``) on commands and folders made here: what it claims,
when a ``checkpoint-N`` is complete, how each front-end is resumed (a flag, or a derived YAML), that a
finished run is never resumed, its remedies on argv and YAML, its progress bar, rules and doctor.

The folders mirror the real bed's (``../shared/realhf/README.md``): ``trainer_state.json`` written last,
weights in safetensors, ``optimizer.pt``/``scheduler.pt``/``rng_state.pth``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from trainsup.adapters.hf.adapter import FAMILY, HfRun
from trainsup.adapters.hf.output import HfOutput
from trainsup.adapters.hf.rules import RULES
from trainsup.adapters.hf.states import at_end, checkpoint_problem
from trainsup.faults.remedies import Action
from trainsup.record.journal import Journal
from trainsup.record.ledger import Ledger
from trainsup.trainers.base import NAMES_SCRIPT, NO_CLAIM, TELLTALE, DoctorFacts, Setup, UsageError
from trainsup.trainers.registry import choose


def checkpoint(out: Path, step: int, max_steps: int, weights: str = "model.safetensors") -> Path:
    """A complete ``checkpoint-STEP`` as the Trainer writes it (``trainer_state.json`` last)."""
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    save_file({"w": np.full((4, 4), step, np.float32)}, str(path / weights))
    for name in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (path / name).write_bytes(b"torch")
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": max_steps,
                                                         "save_steps": 5, "log_history": []}))
    return path


def trl(out: Path, *extra: str) -> tuple[str, ...]:
    return ("trl", "sft", "--model_name_or_path", "m", "--output_dir", str(out), "--max_steps", "20",
            "--save_steps", "5", *extra)


def bound(tmp: Path, argv: tuple[str, ...]) -> tuple[HfRun, Path]:
    run = FAMILY.open(Setup(argv, tmp))
    assert isinstance(run, HfRun)
    run_dir = tmp / "out" / ".trainsup"
    run_dir.mkdir(parents=True, exist_ok=True)
    run.bind(run_dir, Ledger(run_dir / "ledger.json"), Journal(run_dir), lambda _m: None)
    return run, run_dir


# --- claims --------------------------------------------------------------------------------------
@pytest.mark.parametrize("command, claim", [
    ("trl sft --output_dir o", NAMES_SCRIPT),
    ("/venv/bin/trl grpo --output_dir o", NAMES_SCRIPT),
    ("python -m trl kto --output_dir o", NAMES_SCRIPT),
    ("axolotl train examples/llama-3/lora-1b.yml", NAMES_SCRIPT),
    ("llamafactory-cli train examples/train_lora/llama3_lora_sft.yaml", NAMES_SCRIPT),
    ("python train.py --output_dir o --save_steps 100", TELLTALE),
    ("trl env", NO_CLAIM),
    ("python train.py --output_dir o", NO_CLAIM),
    # sd-scripts' and the diffusers scripts' flags are never this family's
    ("python my_lora.py --output_dir o --save_every_n_steps 5 --network_module networks.lora", NO_CLAIM),
    ("accelerate launch my.py --output_dir o --checkpointing_steps 5 --save_steps 5", NO_CLAIM),
])
def test_claims(command: str, claim: int) -> None:
    assert FAMILY.detect(command.split()) == claim


def test_neither_kohya_nor_diffusers_commands_are_taken_and_hf_commands_are_not_theirs() -> None:
    assert choose("accelerate launch train_network.py --output_dir o --save_every_n_steps 5".split()).name == "kohya"
    assert choose(("accelerate launch train_dreambooth_lora.py --pretrained_model_name_or_path M --output_dir o "
                   "--checkpointing_steps 500").split()).name != "hf"
    clm = "accelerate launch run_clm.py --model_name_or_path m --output_dir o --save_steps 5"
    assert choose(clm.split()).name == "hf"


def test_a_projects_trainer_hf_names_it_for_a_script_its_flags_do_not_betray(tmp_path: Path) -> None:
    argv = "python finetune.py --output_dir o --num_train_epochs 3".split()
    assert choose(argv).name == "command"
    assert choose(argv, "hf").name == "hf"
    run = choose(argv, "hf").open(Setup(tuple(argv), tmp_path))
    assert run.output_dir == tmp_path / "o" and run.total_steps is None


# --- complete checkpoints ------------------------------------------------------------------------
def test_a_checkpoint_is_complete_only_with_every_file_the_trainer_writes(tmp_path: Path) -> None:
    good = checkpoint(tmp_path, 10, 20)
    assert checkpoint_problem(good) == ""
    assert checkpoint_problem(checkpoint(tmp_path / "lora", 5, 20, "adapter_model.safetensors")) == ""
    for cut, why in (("trainer_state.json", "trainer_state.json missing"), ("rng_state.pth", "rng_state"),
                     ("scheduler.pt", "scheduler.pt"), ("optimizer.pt", "optimizer.pt"),
                     ("model.safetensors", "no model weights")):
        c = checkpoint(tmp_path / cut, 15, 20)
        (c / cut).unlink()
        assert why in checkpoint_problem(c), cut


def test_a_truncated_weights_file_a_tmp_leftover_or_a_wrong_step_is_not_complete(tmp_path: Path) -> None:
    c = checkpoint(tmp_path / "a", 10, 20)
    data = (c / "model.safetensors").read_bytes()
    (c / "model.safetensors").write_bytes(data[:-8])
    assert "truncated" in checkpoint_problem(c)
    c = checkpoint(tmp_path / "b", 10, 20)
    (c / ".tmpab12cd").write_bytes(b"x")
    assert ".tmpab12cd" in checkpoint_problem(c)
    c = checkpoint(tmp_path / "c", 10, 20)
    (c / "trainer_state.json").write_text(json.dumps({"global_step": 9}))
    assert "global_step 9" in checkpoint_problem(c)
    (c / "trainer_state.json").write_text('{"global_st')
    assert "unreadable" in checkpoint_problem(c)


def test_sharded_weights_need_every_shard_of_the_index(tmp_path: Path) -> None:
    c = checkpoint(tmp_path, 10, 20)
    (c / "model.safetensors").unlink()
    save_file({"a": np.ones(2, np.float32)}, str(c / "model-00001-of-00002.safetensors"))
    (c / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    assert "model-00002-of-00002.safetensors missing" in checkpoint_problem(c)
    save_file({"b": np.ones(2, np.float32)}, str(c / "model-00002-of-00002.safetensors"))
    assert checkpoint_problem(c) == ""


# --- resume --------------------------------------------------------------------------------------
def test_a_resume_names_the_newest_complete_checkpoint_and_sets_a_cut_one_aside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, run_dir = bound(tmp_path, trl(out))
    launch = run.launch(run.plan.copy(), 1, None, run_dir)
    run.states.begin(1, launch)
    assert "--resume_from_checkpoint" not in launch.argv
    ten = checkpoint(out, 10, 20)
    cut = checkpoint(out, 15, 20)
    (cut / "trainer_state.json").unlink()  # killed before its last file
    run.states.collect()
    resume = run.states.newest(None, 20, run.plan)
    assert resume is not None and resume.dir == str(ten) and resume.step == 10
    launch = run.launch(run.plan.copy(), 2, resume, run_dir)
    argv = list(launch.argv)
    assert argv[argv.index("--resume_from_checkpoint") + 1] == str(ten) and launch.resume_step == 10
    assert not cut.exists() and (run_dir / "set-aside" / "attempt-2" / "checkpoint-15" / "config.json").is_file()
    assert not re.fullmatch(r"checkpoint-\d+", "set-aside")  # the Trainer's "latest" never looks there


def test_a_checkpoint_at_the_last_step_is_never_resumed_from(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run, run_dir = bound(tmp_path, trl(out))
    run.states.begin(1, run.launch(run.plan.copy(), 1, None, run_dir))
    checkpoint(out, 15, 20)
    last = checkpoint(out, 20, 20)
    assert at_end(last)
    run.states.collect()
    resume = run.states.newest(None, 20, run.plan)
    assert resume is not None and resume.step == 15
    # an epoch-limited run (no --max_steps): the checkpoint's own max_steps says it is the end
    assert run.states.newest(None, None, run.plan).step == 15  # type: ignore[union-attr]


def test_a_users_resume_of_a_finished_run_launches_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    checkpoint(out, 20, 20)
    with pytest.raises(UsageError, match="the run is finished"):
        FAMILY.open(Setup(trl(out, "--resume_from_checkpoint", str(out / "checkpoint-20")), tmp_path))


def test_trl_latest_through_its_config_becomes_the_newest_complete_checkpoint_and_a_derived_yaml(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    checkpoint(out, 5, 20)
    ten = checkpoint(out, 10, 20)
    (out / "checkpoint-15").mkdir()  # cut: empty
    cfg = tmp_path / "resume.yaml"
    cfg.write_text("resume_from_checkpoint: true\n")
    run = FAMILY.open(Setup(trl(out, "--config", str(cfg)), tmp_path))
    assert run.user_resume == ten and any("newest complete" in n for n in run.notes)
    # a fresh start (nothing to resume): the config's "latest" must go, in a copy
    run, run_dir = bound(tmp_path, trl(out, "--config", str(cfg)))
    argv = list(run.launch(run.plan.copy(), 2, None, run_dir).argv)
    derived = Path(argv[argv.index("--config") + 1])
    assert derived.parent == run_dir and "resume_from_checkpoint" not in yaml.safe_load(derived.read_text())
    assert cfg.read_text() == "resume_from_checkpoint: true\n"


AXOLOTL = """base_model: NousResearch/Llama-3.2-1B
datasets:
  - path: teknium/GPT4-LLM-Cleaned
    type: alpaca
output_dir: ./outputs/lora-out
adapter: lora
micro_batch_size: 2
gradient_accumulation_steps: 4
max_steps: 200
save_steps: 50
auto_resume_from_checkpoints: true
"""

LLAMAFACTORY = """model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
stage: sft
do_train: true
finetuning_type: lora
dataset: identity,alpaca_en_demo
output_dir: saves/llama3-8b/lora/sft
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
max_steps: 100
save_steps: 20
"""


def test_axolotl_reads_its_output_dir_from_the_yaml_and_resumes_through_a_derived_copy(tmp_path: Path) -> None:
    cfg = tmp_path / "lora.yml"
    cfg.write_text(AXOLOTL)
    out = tmp_path / "outputs" / "lora-out"
    ten = checkpoint(out, 50, 200)
    run = FAMILY.open(Setup(("axolotl", "train", "lora.yml"), tmp_path))
    assert run.output_dir == out and run.total_steps == 200
    assert run.user_resume == ten  # auto_resume_from_checkpoints: the newest complete one, named
    run_dir = tmp_path / "rd"
    run_dir.mkdir()
    run.bind(run_dir, Ledger(run_dir / "ledger.json"), Journal(run_dir), lambda _m: None)
    run.states.adopt(ten)
    launch = run.launch(run.plan.copy(), 1, run.states.newest(None, 200, run.plan), run_dir)
    assert launch.argv[:2] == ("axolotl", "train")
    derived = yaml.safe_load(Path(launch.argv[2]).read_text())
    assert derived["resume_from_checkpoint"] == str(ten) and derived["auto_resume_from_checkpoints"] is False
    assert derived["micro_batch_size"] == 2 and cfg.read_text() == AXOLOTL


def test_llamafactory_takes_key_value_overrides_after_its_yaml(tmp_path: Path) -> None:
    (tmp_path / "sft.yaml").write_text(LLAMAFACTORY)
    run = FAMILY.open(Setup(("llamafactory-cli", "train", "sft.yaml", "output_dir=elsewhere"), tmp_path))
    assert run.output_dir == tmp_path / "elsewhere" and run.total_steps == 100


def test_an_unreadable_yaml_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read the config"):
        FAMILY.open(Setup(("axolotl", "train", "missing.yml"), tmp_path))


# --- remedies ------------------------------------------------------------------------------------
def test_halving_the_batch_keeps_the_effective_batch(tmp_path: Path) -> None:
    run = FAMILY.open(Setup(trl(tmp_path / "out", "--per_device_train_batch_size", "8",
                                "--gradient_accumulation_steps", "2"), tmp_path))
    plan = run.plan.copy()
    said = run.apply(plan, Action("halve_batch"))
    assert said is not None and "the same effective batch" in said
    assert plan.value("per_device_train_batch_size") == "4" and plan.value("gradient_accumulation_steps") == "4"
    assert run.plan.value("per_device_train_batch_size") == "8"  # only the copy changed
    plan.set("per_device_train_batch_size", 3)
    run.apply(plan, Action("halve_batch"))
    assert plan.value("per_device_train_batch_size") == "1" and plan.value("gradient_accumulation_steps") == "12"
    assert run.apply(plan, Action("halve_batch")) is None  # batch 1: nothing left to halve


def test_gradient_checkpointing_is_added_where_it_is_off(tmp_path: Path) -> None:
    rung = Action("add_flag", "gradient_checkpointing", "true")
    trl_run = FAMILY.open(Setup(trl(tmp_path / "out"), tmp_path))
    assert trl_run.apply(trl_run.plan.copy(), rung) is None  # TRL's default is on
    script = FAMILY.open(Setup(("python", "train.py", "--output_dir", "o", "--save_steps", "5"), tmp_path))
    plan = script.plan.copy()
    assert script.apply(plan, rung) == "add --gradient_checkpointing true"
    assert plan.argv()[-2:] == ["--gradient_checkpointing", "true"]


def test_a_yaml_front_ends_remedy_goes_into_its_derived_copy(tmp_path: Path) -> None:
    (tmp_path / "lora.yml").write_text(AXOLOTL.replace("auto_resume_from_checkpoints: true\n", ""))
    run = FAMILY.open(Setup(("axolotl", "train", "lora.yml"), tmp_path))
    plan = run.plan.copy()
    assert run.apply(plan, Action("halve_batch")) is not None
    run_dir = tmp_path / "rd"
    run_dir.mkdir()
    run.bind(run_dir, Ledger(run_dir / "ledger.json"), Journal(run_dir), lambda _m: None)
    derived = yaml.safe_load(Path(run.launch(plan, 2, None, run_dir).argv[2]).read_text())
    assert (derived["micro_batch_size"], derived["gradient_accumulation_steps"]) == (1, 8)
    assert any("micro_batch_size" in n for n in run.plan_notes(plan))


# --- output, rules, doctor -----------------------------------------------------------------------
def test_the_training_bar_is_progress_and_other_bars_are_not(tmp_path: Path) -> None:
    assert FAMILY.output().progress(" 50%|█████     | 10/20 [00:00<00:00, 41.60it/s]") is None  # a log's: whose?
    fmt = HfOutput()
    fmt.begin(20)
    p = fmt.progress(" 50%|█████     | 10/20 [00:00<00:00, 41.60it/s]")
    assert p is not None and (p.step, p.total) == (10, 20) and p.rate == pytest.approx(41.6)
    assert fmt.progress("Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 367.86it/s]") is None
    assert fmt.progress(" 40%|████      | 2/5 [00:00<00:00, 9.1it/s]") is None  # the evaluation bar
    slow = fmt.progress(" 55%|█████▌    | 11/20 [00:10<00:09, 1.25s/it]")
    assert slow is not None and slow.rate == pytest.approx(0.8)


def test_a_nan_loss_in_the_trainers_dict_and_bf16_on_a_cpu_are_recognised() -> None:
    def ids(line: str) -> list[str]:
        return [r.id for r in RULES if any(re.search(p, line) for p in r.patterns)]
    assert ids("{'loss': 'nan', 'grad_norm': 'nan', 'learning_rate': '1e-05', 'epoch': '1.375'}") == ["nan_loss"]
    assert ids("{'loss': nan, 'grad_norm': nan, 'epoch': 1.38}") == ["nan_loss"]
    assert ids("{'loss': '6.191', 'epoch': '1.375'}") == []
    assert ids("ValueError: Your setup doesn't support bf16/gpu. You need to assign use_cpu if you want to "
               "train the model on CPU.") == ["bf16_unsupported"]


def test_bf16_refused_on_a_cpu_is_turned_off_in_the_flags_or_the_yaml(tmp_path: Path) -> None:
    (rung, _stop) = FAMILY.open(Setup(trl(tmp_path / "out"), tmp_path)).ladder("bf16_unsupported")
    run = FAMILY.open(Setup(trl(tmp_path / "out"), tmp_path))
    plan = run.plan.copy()
    assert run.apply(plan, rung.actions[0]) is not None and plan.argv()[-2:] == ["--bf16", "false"]
    assert run.apply(plan, rung.actions[0]) is None  # already off
    (tmp_path / "sft.yaml").write_text(LLAMAFACTORY + "bf16: true\n")
    lf = FAMILY.open(Setup(("llamafactory-cli", "train", "sft.yaml"), tmp_path))
    plan = lf.plan.copy()
    assert lf.apply(plan, rung.actions[0]) is not None and plan.derived()["bf16"] is False


def test_doctor_warns_of_bf16_on_a_cpu_torch_and_blocks_a_resume_path_that_is_no_checkpoint(tmp_path: Path) -> None:
    run = FAMILY.open(Setup(trl(tmp_path / "out", "--resume_from_checkpoint", str(tmp_path / "nope")), tmp_path))
    run.doctor_facts = DoctorFacts(python="/x/python", versions={"torch": "2.13.0+cpu"})
    found = {f.id: f.severity for f in run.doctor({})}
    assert found == {"bf16_cpu": "warning", "resume": "blocker"}
    ok = FAMILY.open(Setup(trl(tmp_path / "out", "--bf16", "false"), tmp_path))
    ok.doctor_facts = DoctorFacts(python="/x/python", versions={"torch": "2.13.0+cpu"})
    assert ok.doctor({}) == []
