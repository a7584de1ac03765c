"""musubi-tuner as its own family (issue 31), a variant of the sd-scripts adapter: its scripts claimed
by name, a resume by ``--resume`` and the steps left (never ``--initial_step``), labels offset by the
resume step, each later attempt under its own output name and its saves published under true names,
states complete by accelerate's files alone, its output lines, ``--output_name`` required, its
attention flag checked by doctor, its prompt options accepted."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.contract.kit import launched
from trainsup.adapters.kohya.prompts import PromptError, parse_prompt_bytes
from trainsup.adapters.kohya.states import check_state
from trainsup.adapters.musubi.adapter import FAMILY, MusubiRun
from trainsup.adapters.musubi.output import TOTAL_STEPS, MusubiOutput
from trainsup.adapters.musubi.profile import MUSUBI, PROMPT_OPTIONS, SCRIPTS
from trainsup.faults.remedies import Action
from trainsup.record.journal import Journal
from trainsup.record.ledger import Ledger, StateRecord
from trainsup.trainers.base import NAMES_SCRIPT, NO_CLAIM, Setup, UsageError, rung_applies
from trainsup.trainers.registry import choose, families

SNAPSHOT = Path(__file__).resolve().parents[3] / "shared" / "realmusubi" / "musubi-tuner" / "src" / "musubi_tuner"
# The snapshot's training scripts (``*train*.py``), for CI copies without ../shared.
KNOWN = ("flux_2_train_network", "flux_2_train_network_self_flow", "flux_kontext_train_network",
         "fpack_train_network", "hidream_o1_train", "hidream_o1_train_network", "hv_1_5_train_network", "hv_train",
         "hv_train_network", "ideogram4_train_network", "kandinsky5_train_network", "krea2_train_network",
         "qwen_image_train", "qwen_image_train_network", "wan_train_network", "zimage_train", "zimage_train_network")
SD_SCRIPTS = ("train_network", "sdxl_train_network", "flux_train_network", "sd3_train_network", "lumina_train_network",
              "train_db", "fine_tune", "sdxl_train", "flux_train", "sd3_train")


def _scripts() -> list[str]:
    found = sorted(p.stem for p in SNAPSHOT.glob("*train*.py")) if SNAPSHOT.is_dir() else []
    return sorted({*found, *KNOWN})


@pytest.mark.parametrize("script", _scripts())
def test_every_musubi_training_script_is_musubis_by_name_in_every_form(script: str) -> None:
    assert script in SCRIPTS
    for argv in (f"accelerate launch --mixed_precision bf16 src/musubi_tuner/{script}.py --dit d",
                 f"python {script}.py --dit d", f"python -m musubi_tuner.{script} --dit d"):
        assert FAMILY.detect(argv.split()) == NAMES_SCRIPT, argv
        assert families()["kohya"].detect(argv.split()) < NAMES_SCRIPT, argv
        assert choose(argv.split()).name == "musubi", argv


@pytest.mark.parametrize("script", SD_SCRIPTS)
def test_musubi_never_claims_an_sd_scripts_script(script: str) -> None:
    argv = f"accelerate launch {script}.py --network_module networks.lora".split()
    assert FAMILY.detect(argv) == NO_CLAIM
    assert choose(argv).name == "kohya"


def _argv(tmp: Path, *extra: str) -> tuple[str, ...]:
    return ("accelerate", "launch", "src/musubi_tuner/wan_train_network.py", "--task", "t2v-1.3B", "--sdpa",
            "--dit", "dit.safetensors", "--output_dir", str(tmp / "out"), "--output_name", "tiny",
            "--save_every_n_steps", "5", "--save_state", "--seed", "42", *extra)


def _bound(tmp: Path, *extra: str) -> tuple[MusubiRun, Path]:
    run = MusubiRun(Setup(_argv(tmp, *extra), tmp))
    run_dir = tmp / "out" / ".trainsup"
    run_dir.mkdir(parents=True)
    run.bind(run_dir, Ledger.load(run_dir / "ledger.json"), Journal(run_dir), lambda _m: None)
    return run, run_dir


def _state(path: Path, processes: int = 1) -> Path:
    path.mkdir(parents=True)
    save_file({"lora.down": np.ones((2, 2), np.float32)}, str(path / "model.safetensors"))
    for part in ("optimizer.bin", "scheduler.bin", *(f"random_states_{n}.pkl" for n in range(processes))):
        (path / part).write_bytes(b"x")
    return path


def _weights(path: Path) -> Path:
    save_file({"lora.down": np.ones((2, 2), np.float32)}, str(path))
    return path


def test_a_resume_is_resume_and_the_steps_left_never_initial_step(tmp_path: Path) -> None:
    run, run_dir = _bound(tmp_path, "--max_train_steps", "20")
    first = launched(run, run.plan.copy(), 1, None, run_dir)
    assert "--resume" not in first and first[first.index("--output_name") + 1] == "tiny"
    state = _state(tmp_path / "out" / "tiny-step00000010-state")
    run.states.collect()
    launch = run.launch(run.plan.copy(), 2, StateRecord(str(state), 10, 1, 10), run_dir)
    argv = list(launch.argv)
    assert argv[argv.index("--resume") + 1] == str(state)
    assert argv[argv.index("--max_train_steps") + 1] == "10"  # it counts from 0 and trains this many
    assert "--initial_step" not in argv and "--skip_until_initial_step" not in argv
    assert argv[argv.index("--output_name") + 1] == "tiny-trainsup2"  # never over an earlier save
    assert launch.label_offset == 10 and launch.resume_step == 10
    assert run.output.absolute_steps is False  # its bar counts from the resume point


def test_a_run_of_epochs_resumes_by_the_steps_left_of_musubis_own_count(tmp_path: Path) -> None:
    run, run_dir = _bound(tmp_path, "--max_train_epochs", "3")
    launched(run, run.plan.copy(), 1, None, run_dir)
    fmt = MusubiOutput()
    facts: dict[str, object] = {}
    for line in ("  num batches per epoch / 1epochのバッチ数: 8",
                 "  gradient accumulation steps / 勾配を合計するステップ数 = 1",
                 "  total optimization steps / 学習ステップ数: 24"):
        summary = fmt.summary(line)
        assert summary is not None
        facts.update(summary.facts)
    assert summary.complete and facts[TOTAL_STEPS] == 24
    run.on_summary(facts)
    assert run.total_steps == 24
    argv = list(run.launch(run.plan.copy(), 2, StateRecord("s", 10, 1, 10), run_dir).argv)
    assert argv[argv.index("--max_train_steps") + 1] == "14" and "--max_train_epochs" not in argv


def test_a_resumed_attempts_saves_are_published_under_true_names_and_its_final_where_the_user_said(
        tmp_path: Path) -> None:
    run, run_dir = _bound(tmp_path, "--max_train_steps", "20")
    out = tmp_path / "out"
    launched(run, run.plan.copy(), 1, None, run_dir)
    _weights(out / "tiny-step00000010.safetensors")
    resume = _state(out / "tiny-step00000010-state")
    assert [s.step for s in run.states.collect()] == [10]
    launched(run, run.plan.copy(), 2, run.states.newest(None, 20), run_dir)
    # musubi labels the resumed attempt's saves from 0: its step 5 is the true step 15
    _weights(out / "tiny-trainsup2-step00000005.safetensors")
    _state(out / "tiny-trainsup2-step00000005-state")
    assert [s.step for s in run.states.collect()] == [15]
    assert check_state(out / "tiny-step00000015-state", dialect=MUSUBI).ok
    assert (out / "tiny-step00000015.safetensors").is_file()
    assert not (out / "tiny-trainsup2-step00000005-state").exists()  # out of sight, in the run dir
    assert check_state(resume, dialect=MUSUBI).ok  # the state it resumed from is untouched
    _weights(out / "tiny-trainsup2.safetensors")
    _state(out / "tiny-trainsup2-state")
    run.states.collect()
    assert run.states.publish_final() == str(out / "tiny.safetensors")
    assert check_state(out / "tiny-state", dialect=MUSUBI).ok
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert visible == ["tiny-state", "tiny-step00000010-state", "tiny-step00000010.safetensors",
                       "tiny-step00000015-state", "tiny-step00000015.safetensors", "tiny.safetensors"]


def test_a_musubi_state_is_complete_by_accelerates_files_with_every_process_random_states_last(
        tmp_path: Path) -> None:
    state = _state(tmp_path / "tiny-step00000010-state")
    check = check_state(state, dialect=MUSUBI)
    assert check.ok and check.label_step == 10  # no train_state.json: the step is in its name
    assert not check_state(state).ok  # sd-scripts' own state needs its train_state.json
    assert not check_state(state, dialect=MUSUBI, processes=2).ok  # random_states_1.pkl not written yet
    (state / "random_states_0.pkl").unlink()  # musubi would "resume" it silently
    assert check_state(state, dialect=MUSUBI).reason == "random_states_0.pkl missing or empty"
    cut = _state(tmp_path / "tiny-step00000015-state")
    (cut / "model.safetensors").write_bytes((cut / "model.safetensors").read_bytes()[:-4])
    assert not check_state(cut, dialect=MUSUBI).ok


def test_two_processes_need_two_random_states(tmp_path: Path) -> None:
    run = MusubiRun(Setup(("accelerate", "launch", "--num_processes", "2", *_argv(tmp_path)[2:]), tmp_path))
    assert run.processes() == 2
    assert MusubiRun(Setup(_argv(tmp_path), tmp_path)).processes() == 1


def test_musubis_output_lines() -> None:
    fmt = FAMILY.output()
    bar = fmt.progress("steps:  50%|█████     | 10/20 [00:20<00:20,  2.02s/it, avr_loss=2.5]")
    assert bar is not None and (bar.step, bar.total, bar.loss) == (10, 20, 2.5)
    done = fmt.state_completed("INFO:accelerate.checkpointing:Random states saved in "
                               "OUT/tiny-step00000005-state/random_states_0.pkl")
    assert done is not None and done.dir == "OUT/tiny-step00000005-state"
    assert fmt.state_started("INFO:musubi_tuner.utils.train_utils:saving state at step 5") == 5
    assert fmt.is_success("INFO:musubi_tuner.training.trainer_base:model saved.")


def test_output_name_is_required_before_launch(tmp_path: Path) -> None:
    argv = [a for a in _argv(tmp_path) if a not in ("--output_name", "tiny")]
    with pytest.raises(UsageError, match="--output_name"):
        MusubiRun(Setup(tuple(argv), tmp_path))
    MusubiRun(Setup(tuple(argv), tmp_path, as_given=True))  # diagnose reads it as given


def test_doctor_blocks_a_command_without_an_attention_flag(tmp_path: Path) -> None:
    run = MusubiRun(Setup(tuple(a for a in _argv(tmp_path) if a != "--sdpa"), tmp_path))
    assert "no_attention_flag" in {f.id for f in run.doctor(dict(os.environ)) if f.severity == "blocker"}
    ok = MusubiRun(Setup(_argv(tmp_path), tmp_path))
    assert "no_attention_flag" not in {f.id for f in ok.doctor(dict(os.environ))}


def test_musubis_prompt_options_are_accepted_and_still_checked(tmp_path: Path) -> None:
    line = b"a red cube --w 64 --h 64 --f 1 --s 2 --d 42 --fs 7.0 --l 5 --g 1.0 --n blurry --i a.png --of x=1\n"
    assert parse_prompt_bytes(tmp_path / "p.txt", line, PROMPT_OPTIONS) == ["a red cube"]
    with pytest.raises(PromptError, match="unknown option --fs"):
        parse_prompt_bytes(tmp_path / "p.txt", line)  # sd-scripts has no --fs
    with pytest.raises(PromptError, match="--fs expects a number"):
        parse_prompt_bytes(tmp_path / "p.txt", b"a cat --fs fast\n", PROMPT_OPTIONS)


def test_memory_remedies_are_musubis_own_flags(tmp_path: Path) -> None:
    run = MusubiRun(Setup(_argv(tmp_path), tmp_path))
    ladder = run.ladder("cuda_oom")
    fp8 = next(r for r in ladder if any(a.name == "fp8_base" for a in r.actions))
    assert {a.name for a in fp8.actions} == {"fp8_base", "fp8_scaled"}  # never --fp8_base alone
    plan = run.plan.copy()
    for action in fp8.actions:
        run.apply(plan, action)
    assert plan.command.has("fp8_base") and plan.command.has("fp8_scaled")
    assert run.apply(run.plan.copy(), Action("add_flag", "lowram")) is None  # musubi has none
    assert not any(a.name in ("lowram", "cache_text_encoder_outputs") for r in run.ladder("host_oom_killed")
                   for a in r.actions)
    assert rung_applies(run, run.plan, next(r for r in ladder if any(a.name == "blocks_to_swap" for a in r.actions)))


def test_halving_the_batch_halves_the_dataset_tomls_batch_size_in_a_derived_copy(tmp_path: Path) -> None:
    toml = tmp_path / "dataset.toml"
    toml.write_text('[general]\nresolution = [64, 64]\nbatch_size = 4\n\n[[datasets]]\nimage_directory = "img"\n'
                    'cache_directory = "cache"\n')
    run, run_dir = _bound(tmp_path, "--dataset_config", str(toml))
    plan = run.plan.copy()
    assert run.apply(plan, Action("halve_batch")) is not None
    argv = launched(run, plan, 1, None, run_dir)
    derived = Path(argv[argv.index("--dataset_config") + 1])
    assert derived != toml and "batch_size = 2" in derived.read_text() and "batch_size = 4" in toml.read_text()
    assert argv[argv.index("--gradient_accumulation_steps") + 1] == "2"
