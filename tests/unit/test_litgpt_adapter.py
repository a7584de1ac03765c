"""The LitGPT adapter, pure: recognising the command, reading and editing its settings (flags, dotted
flags, ``--config`` files), the ladders, the fault rules on LitGPT's wording, its progress lines, and
its step folders made here on disk. Lines and tracebacks are modelled on what the real trainer
printed on the CPU bed (``../shared/reallitgpt/README.md``)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.contract.kit import launched
from trainsup.adapters.litgpt.adapter import FAMILY, LitgptRun
from trainsup.adapters.litgpt.plan import LitPlan
from trainsup.adapters.litgpt.rules import RUN_RULES
from trainsup.adapters.litgpt.states import weights_problem
from trainsup.faults.remedies import Action, Rung
from trainsup.faults.rules import BUILTIN_RULES
from trainsup.faults.scanner import FaultScanner
from trainsup.faults.verdict import Said
from trainsup.record.journal import Journal, read_events
from trainsup.record.ledger import Ledger
from trainsup.trainers.base import Setup, StateSaved, UsageError, rung_applies
from trainsup.trainers.registry import choose

CKPT = "/models/tiny-gpt"


def lora(*extra: str, sub: str = "finetune_lora", out: str = "/out") -> list[str]:
    return ["/venv/bin/litgpt", sub, CKPT, "--out_dir", out, "--precision", "32-true",
            "--train.global_batch_size", "4", "--train.micro_batch_size", "4", "--train.max_steps", "20",
            "--train.save_interval", "5", "--train.lr_warmup_steps", "2", *extra]


def open_run(argv: list[str], cwd: Path, as_given: bool = False) -> LitgptRun:
    run = FAMILY.open(Setup(tuple(argv), cwd, as_given=as_given))
    assert isinstance(run, LitgptRun)
    return run


@pytest.fixture
def bound(tmp_path: Path) -> Iterator[tuple[Path, list[str], Journal]]:
    """A run dir, what the adapter says, and a journal (closed after the test)."""
    run_dir = tmp_path / "out" / ".trainsup"
    run_dir.mkdir(parents=True)
    journal = Journal(run_dir)
    yield run_dir, [], journal
    journal.close()


def bind(run: LitgptRun, run_dir: Path, said: list[str], journal: Journal) -> Ledger:
    ledger = Ledger(run_dir / "ledger.json")
    run.bind(run_dir, ledger, journal, said.append)
    return ledger


def torch_zip(path: Path, payload: bytes = b"tensor bytes " * 50) -> Path:
    """A file shaped like torch.save's: a stored (uncompressed) zip archive."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"pickle")
        z.writestr("archive/data/0", payload)
    return path


def state(out: Path, step: int, weights: str = "lit_model.pth.lora", marker: bool = True) -> Path:
    folder = out / f"step-{step:06d}"
    torch_zip(folder / weights)
    for name in ("model_config.yaml", "tokenizer.json", "hyperparameters.yaml"):
        (folder / name).write_text("x")
    if marker:
        (folder / "prompt_style.yaml").write_text("class_path: litgpt.prompts.Alpaca\n")
    return folder


# --- recognising the command -------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "family"), [
    ("litgpt finetune_lora /m --out_dir o", "litgpt"),
    ("/home/u/venv/bin/litgpt finetune_full /m", "litgpt"),
    ("litgpt finetune /m", "litgpt"),  # litgpt's alias of finetune_lora
    ("litgpt finetune_adapter_v2 /m", "litgpt"),
    ("litgpt pretrain pythia-14m --out_dir o", "litgpt"),
    ("python -m litgpt finetune_lora /m", "litgpt"),
    ("/venv/bin/python3.11 -u -m litgpt finetune_full /m", "litgpt"),
    ("litgpt generate /m --prompt hi", "command"),  # not a training run
    ("litgpt download EleutherAI/pythia-14m", "command"),
    ("python -m litgpt", "command"),
])
def test_litgpt_training_commands_are_recognised_and_others_are_not(argv: str, family: str) -> None:
    assert choose(argv.split()).name == family


def test_the_plan_reads_flags_equals_dotted_flags_and_the_positional(tmp_path: Path) -> None:
    run = open_run(["litgpt", "finetune_lora", "--out_dir=/o", "--train.micro_batch_size", "2", CKPT,
                    "--data", "JSON", "--data.num_workers=0"], tmp_path)
    plan = run.plan
    assert plan.subcommand == "finetune_lora" and plan.positional() == CKPT
    assert (plan.value("out_dir"), plan.value("train.micro_batch_size"), plan.value("data.num_workers")) == \
        ("/o", "2", "0")
    assert run.output_dir == Path("/o")
    plan.set("train.micro_batch_size", "1")
    assert plan.argv() == ["litgpt", "finetune_lora", "--out_dir", "/o", "--train.micro_batch_size", "1", CKPT,
                           "--data", "JSON", "--data.num_workers", "0"]


def test_a_relative_out_dir_and_the_methods_default_are_taken_from_the_cwd(tmp_path: Path) -> None:
    assert open_run(["litgpt", "finetune_full", CKPT, "--out_dir", "runs/a"], tmp_path).output_dir == \
        tmp_path / "runs" / "a"
    assert open_run(["litgpt", "finetune_lora", CKPT], tmp_path).output_dir == tmp_path / "out/finetune/lora"


def test_a_bad_number_or_an_unreadable_config_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--train\.max_steps: expected an integer, got 'ten'"):
        open_run(lora("--train.max_steps", "ten"), tmp_path)
    with pytest.raises(UsageError, match="--config nope.yaml: cannot read"):
        open_run(lora("--config", "nope.yaml"), tmp_path)
    # read for diagnose only: its settings are unknown, not an error
    assert open_run(lora("--config", "nope.yaml"), tmp_path, as_given=True).settings_unknown


# --- --config files ----------------------------------------------------------------------------

def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return path


def test_config_values_count_in_jsonargparse_order_and_the_command_line_after_them_wins(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "train:\n  max_steps: 30\n  lr_warmup_steps: 5\n"
                       "data:\n  class_path: litgpt.data.JSON\n  init_args:\n    num_workers: 0\n"
                       "train.save_interval: 3\n")
    before = open_run(["litgpt", "finetune_lora", CKPT, "--train.max_steps", "7", "--config", str(cfg)], tmp_path)
    after = open_run(["litgpt", "finetune_lora", CKPT, "--config", str(cfg), "--train.max_steps", "7"], tmp_path)
    assert before.plan.value("train.max_steps") == "30" and after.plan.value("train.max_steps") == "7"
    assert after.total_steps == 7
    assert after.plan.value("data.num_workers") == "0"  # under init_args
    assert after.plan.value("train.save_interval") == "3"  # a flat dotted key


def test_a_remedy_of_a_key_set_only_in_the_config_writes_a_derived_copy_never_the_users_file(
        tmp_path: Path, bound: tuple[Path, list[str], Journal]) -> None:
    text = "# mine\ntrain:\n  max_steps: 20\n  lr_warmup_steps: 20\nprecision: 32-true\n"
    cfg = write_config(tmp_path, text)
    run_dir, said, journal = bound
    run = open_run(["litgpt", "finetune_lora", CKPT, "--out_dir", str(tmp_path / "out"), "--config", str(cfg)],
                   tmp_path)
    bind(run, run_dir, said, journal)
    plan = run.plan.copy()
    change = run.apply(plan, Action("add_flag", "train.lr_warmup_steps"))
    assert change is not None and change.startswith("--train.lr_warmup_steps 19 (was 20")
    assert "--train.lr_warmup_steps" not in plan.argv()  # the config sets it: the copy carries it
    argv = launched(run, plan, 1, None, run_dir)
    derived = Path(argv[argv.index("--config") + 1])
    assert derived == run_dir / "derived" / "attempt-1.config-1.yaml"
    assert yaml.safe_load(derived.read_text())["train"] == {"max_steps": 20, "lr_warmup_steps": 19}
    assert cfg.read_text() == text
    assert run.plan_notes(plan) == [(f"--train.lr_warmup_steps is set in {cfg}: change it there too "
                                    "(trainsup run writes a derived copy instead)")]


# --- fault rules -------------------------------------------------------------------------------

SITE = "/venv/lib/python3.11/site-packages"


def scan(*lines: str) -> tuple[str | None, str | None]:
    scanner = FaultScanner(RUN_RULES + BUILTIN_RULES)
    for n, line in enumerate(lines, 1):
        scanner.feed(line, n)
    verdict = scanner.verdict
    return (verdict.fault, verdict.line) if verdict else (None, None)


def frames(*where: tuple[str, str]) -> list[str]:
    out = ["Traceback (most recent call last):"]
    for path, func in where:
        out += [f'  File "{path}", line 10, in {func}', "    code()"]
    return out


def test_the_schedule_dividing_by_zero_at_the_last_step_is_lr_schedule() -> None:
    lines = frames((f"{SITE}/litgpt/finetune/lora.py", "fit"), (f"{SITE}/torch/optim/lr_scheduler.py", "step"),
                   (f"{SITE}/torch/optim/lr_scheduler.py", "_get_closed_form_lr"),
                   (f"{SITE}/torch/optim/lr_scheduler.py", "<listcomp>"))
    assert scan("Epoch 2 | iter 19 step 19 | loss train: 6.0, val: 6.1 | iter time: 15.00 ms (step)", *lines,
                "ZeroDivisionError: float division by zero") == ("lr_schedule",
                                                                 "ZeroDivisionError: float division by zero")


def test_a_warmup_of_zero_dividing_in_litgpts_lambda_is_lr_schedule_too() -> None:
    lines = frames((f"{SITE}/litgpt/finetune/lora.py", "get_lr_scheduler"),
                   (f"{SITE}/torch/optim/lr_scheduler.py", "get_lr"), (f"{SITE}/litgpt/finetune/lora.py", "<lambda>"))
    assert scan(*lines, "ZeroDivisionError: division by zero")[0] == "lr_schedule"


def test_a_zero_division_anywhere_else_is_not_a_schedule_fault() -> None:
    lines = frames((f"{SITE}/litgpt/finetune/lora.py", "fit"), (f"{SITE}/litgpt/data/json_data.py", "setup"))
    # A crash all the same: read as unknown, with its line (never as healthy, never as the schedule's).
    assert scan(*lines, "ZeroDivisionError: division by zero")[0] == "unknown"


def test_litgpt_wording_for_too_long_samples_bad_precision_and_bad_arguments() -> None:
    assert scan("ValueError: Cannot attend to 2356, block size is only 256. This is likely because the input "
                "text exceeds the supported context length of this model.")[0] == "sequence_too_long"
    assert scan("ValueError: Precision 'fp32' is invalid. Allowed precision values: ('transformer-engine', "
                "'16-true', '32-true', 64, 32)")[0] == "config_error"
    assert scan("usage: litgpt [-h] ...", "error: Unrecognized arguments: --resume auto")[0] == "config_error"
    assert scan("checkpoint_dir '/w/checkpoints/tiny-gpt' is not a checkpoint directory.")[0] == "config_error"
    batch = frames((f"{SITE}/litgpt/finetune/lora.py", "fit"),
                   (f"{SITE}/litgpt/args.py", "gradient_accumulation_iters"))
    assert scan(*batch, "AssertionError")[0] == "config_error"
    assert scan("Epoch 1 | iter 3 step 3 | loss train: nan, val: n/a | iter time: 15.00 ms (step)")[0] == "nan_loss"


def test_the_warmup_warning_and_sampled_text_are_never_evidence() -> None:
    assert scan("/venv/lib/python3.11/site-packages/litgpt/args.py:50: UserWarning: `--train.lr_warmup_steps` "
                "should be less than `--train.max_steps`. Got 20 lr_warmup_steps and 20 max_steps.",
                "Seed set to 1337", "What colour is the snow? \ufffd\ufffd",
                "Epoch 1 | iter 1 step 1 | loss train: 6.229, val: n/a | iter time: 80.00 ms (step)") == (None, None)


# --- ladders -----------------------------------------------------------------------------------

def first_rung(run: LitgptRun, fault: str, evidence: str | None = None) -> tuple[int, Rung] | None:
    for n, rung in enumerate(run.ladder(fault)):
        if rung_applies(run, run.plan, rung, Said(evidence)):
            return n, rung
    return None


def apply_rung(run: LitgptRun, plan: LitPlan, rung: Rung, evidence: str | None = None) -> list[str]:
    return [c for a in rung.actions if (c := run.apply(plan, a, Said(evidence))) is not None]


def test_lr_schedule_sets_the_warmup_just_below_max_steps_and_forces_a_fresh_start(tmp_path: Path) -> None:
    run = open_run(lora("--train.lr_warmup_steps", "20"), tmp_path)
    plan = run.plan.copy()
    changes = apply_rung(run, plan, run.ladder("lr_schedule")[0])
    assert plan.value("train.lr_warmup_steps") == "19" and plan.schedule_gen == 1
    assert "a fresh start from step 0" in changes[0]
    zero = open_run(lora("--train.lr_warmup_steps", "0"), tmp_path).plan.copy()
    apply_rung(run, zero, run.ladder("lr_schedule")[0])
    assert zero.value("train.lr_warmup_steps") == "1"
    by_epochs = open_run(["litgpt", "finetune_full", CKPT, "--train.epochs", "1"], tmp_path).plan.copy()
    apply_rung(run, by_epochs, run.ladder("lr_schedule")[0])  # LitGPT's default warmup 100, halved
    assert by_epochs.value("train.lr_warmup_steps") == "50"
    assert run.ladder("lr_schedule")[-1].actions[0].kind == "stop"


def test_sequence_too_long_sets_max_seq_length_to_the_block_size_the_error_names(tmp_path: Path) -> None:
    run = open_run(lora(), tmp_path)
    evidence = "ValueError: Cannot attend to 2356, block size is only 256. This is likely ..."
    n, rung = first_rung(run, "sequence_too_long", evidence) or (None, None)
    assert n == 0 and rung is not None
    plan = run.plan.copy()
    assert apply_rung(run, plan, rung, evidence) == [
        "--train.max_seq_length 256 (a sample has 2356 tokens; the model's block size is 256)"]
    assert plan.argv()[-2:] == ["--train.max_seq_length", "256"]
    assert first_rung(run, "sequence_too_long", "ValueError: something else") == (1, run.ladder("sequence_too_long")[1])


def test_the_sequence_remedy_reads_the_block_size_its_rule_captured_before_the_line(tmp_path: Path) -> None:
    # LitGPT's own rule puts the numbers on the evidence as named groups (issue 30).
    scanner = FaultScanner(RUN_RULES + BUILTIN_RULES)
    ev = scanner.feed("ValueError: Cannot attend to 2356, block size is only 256. This is likely ...", 1)
    assert ev is not None and ev.fault == "sequence_too_long"
    assert dict(ev.groups) == {"tokens": "2356", "block": "256"}
    run = open_run(lora(), tmp_path)
    rung = run.ladder("sequence_too_long")[0]
    # The groups and the line disagree: the remedy takes the groups' numbers.
    said = Said(ev.line, {"tokens": "3000", "block": "512"})
    plan = run.plan.copy()
    assert [run.apply(plan, a, said) for a in rung.actions] == [
        "--train.max_seq_length 512 (a sample has 3000 tokens; the model's block size is 512)"]
    # Without the groups (a user rule's match, a journal's text) the line is read.
    plan = run.plan.copy()
    assert [run.apply(plan, a, Said(ev.line)) for a in rung.actions] == [
        "--train.max_seq_length 256 (a sample has 2356 tokens; the model's block size is 256)"]
    # Groups alone suffice: no line to read at all.
    assert run.apply(run.plan.copy(), rung.actions[0], Said(None, {"tokens": "9", "block": "8"})) == \
        "--train.max_seq_length 8 (a sample has 9 tokens; the model's block size is 8)"
    assert run.apply(run.plan.copy(), rung.actions[0]) is None  # no evidence: nothing to set it to


def test_an_invalid_precision_stops_naming_the_valid_values(tmp_path: Path) -> None:
    run = open_run(lora("--precision", "fp32"), tmp_path)
    (stop,) = run.ladder("config_error")
    reason = stop.actions[0].value or ""
    assert "--precision 'fp32' is invalid" in reason and "32-true, bf16-true, bf16-mixed" in reason
    small = open_run(lora("--train.global_batch_size", "2"), tmp_path)
    assert "set --train.global_batch_size 4" in (small.ladder("config_error")[0].actions[0].value or "")


def test_meta_tensor_enables_lora_on_query_key_value_then_one_device_then_stops(tmp_path: Path) -> None:
    run = open_run(lora("--devices", "2"), tmp_path)
    plan = run.plan.copy()
    ladder = run.ladder("meta_tensor")
    assert apply_rung(run, plan, ladder[0]) == ["--lora_query true", "--lora_key true", "--lora_value true"]
    assert plan.argv()[-6:] == ["--lora_query", "true", "--lora_key", "true", "--lora_value", "true"]
    assert apply_rung(run, plan, ladder[1]) == ["--devices 1"]
    assert ladder[2].actions[0].kind == "stop"
    # finetune_full has no LoRA, and one device is its default: both rungs mean nothing there
    full = open_run(lora(sub="finetune_full"), tmp_path)
    assert first_rung(full, "meta_tensor") == (2, full.ladder("meta_tensor")[2])


def test_cuda_oom_ladder_allocator_micro_batch_precision_quantize(tmp_path: Path) -> None:
    run = open_run(lora(), tmp_path)
    plan = run.plan.copy()
    rungs = run.ladder("cuda_oom")
    assert apply_rung(run, plan, rungs[0]) == ["set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
    assert apply_rung(run, plan, rungs[1]) == [
        ("--train.micro_batch_size 2 (was 4; --train.global_batch_size stays 4, so gradient accumulation goes "
        "from 1 to 2 iterations)")]
    assert plan.value("train.global_batch_size") == "4"
    assert apply_rung(run, plan, rungs[2]) == ["--precision bf16-true (weights and activations in bfloat16)"]
    assert apply_rung(run, plan, rungs[3]) == ["--quantize bnb.nf4 (4-bit base weights)"]
    assert rungs[4].actions[0].kind == "stop"
    full = open_run(lora("--train.micro_batch_size", "1", "--precision", "bf16-true", sub="finetune_full"), tmp_path)
    assert first_rung(full, "cuda_oom", None) == (0, rungs[0])
    assert not rung_applies(full, full.plan, rungs[1]) and not rung_applies(full, full.plan, rungs[3])


def test_rungs_of_other_trainers_mean_nothing_and_workers_map_to_data_num_workers(tmp_path: Path) -> None:
    run = open_run(lora(), tmp_path)
    assert run.apply(run.plan.copy(), Action("add_flag", "fp8_base")) is None
    assert run.apply(run.plan.copy(), Action("remove_flag", "cache_latents")) is None
    plan = run.plan.copy()  # LitGPT's data modules default to 4 workers
    assert run.apply(plan, Action("lower_workers", value="half")) == "--data.num_workers 2 (was 4)"
    # host_oom_killed: fewer workers (none to lower), --lowram (not LitGPT's), then a plain restart
    zero = open_run(lora("--data.num_workers", "0"), tmp_path)
    rung = first_rung(zero, "host_oom_killed")
    assert rung is not None and rung[1].actions[0].kind == "restart"


# --- output ------------------------------------------------------------------------------------

def line(it: int, step: int, stepped: bool = True, loss: str = "6.148") -> str:
    return (f"Epoch 1 | iter {it} step {step} | loss train: {loss}, val: n/a | iter time: 20.00 ms"
            + (" (step)" if stepped else ""))


def test_progress_is_the_optimizer_step_with_the_runs_total(tmp_path: Path) -> None:
    out = open_run(lora(), tmp_path).lit_output
    out.begin(20, 5, 2)
    p = out.progress(line(7, 3, stepped=False))
    assert p is not None and (p.step, p.total, p.loss) == (3, 20, 6.148) and p.rate == pytest.approx(25.0)
    pretrain = ("Epoch 1 | iter 8 step 2 | loss train: 9.100, val: 9.2 | iter time: 10.00 ms (step) "
                "remaining time: 0:01:02")
    assert (out.progress(pretrain) or p).step == 2
    assert out.progress("iter 10: val loss 6.1534, val time: 45.09 ms") is None


def test_a_save_is_over_when_the_next_iteration_or_the_final_evaluation_prints(tmp_path: Path) -> None:
    out = open_run(lora(), tmp_path).lit_output
    out.begin(20, 5, 1)
    assert [out.state_completed(line(n, n)) for n in (4, 5)] == [None, None]  # step 5 saves after its line
    assert out.state_completed("Validating ...") is None
    assert out.state_completed(line(6, 6)) == StateSaved()  # look on disk: step-000005 is written
    assert out.state_completed(line(7, 7)) is None
    out.state_completed(line(20, 20))
    assert out.state_completed("Final evaluation | val loss: 6.126 | val ppl: 457.798") == StateSaved()
    # finetune_full names the folder before writing it; accumulating iterations still mean it is over
    out.begin(20, None, 2)
    out.state_completed(line(20, 10))
    assert out.state_completed("Saving checkpoint to '/out/step-000010'") is None
    assert out.state_completed(line(21, 10, stepped=False)) == StateSaved()
    assert out.bookkeeping is not None and out.bookkeeping.search(line(3, 3))


def test_validation_and_saving_start_phases_the_hang_clock_knows() -> None:
    from trainsup.sensors.hang import PHASES
    out = FAMILY.open(Setup(tuple(lora()), Path("/"))).output
    assert dict(out.phase_starts) == {"Saving checkpoint to ": "saving", "Validating ...": "sampling"}
    assert set(dict(out.phase_starts).values()) <= set(PHASES)


# --- states ------------------------------------------------------------------------------------

def test_weights_are_checked_without_torch_as_a_zip_archive(tmp_path: Path) -> None:
    good = torch_zip(tmp_path / "a.pth")
    assert weights_problem(good) == ""
    empty = tmp_path / "b.pth"
    empty.write_bytes(b"")
    assert "empty" in weights_problem(empty)
    truncated = tmp_path / "c.pth"
    truncated.write_bytes(good.read_bytes()[:200])
    assert "not a whole torch.save archive" in weights_problem(truncated)
    flipped = bytearray(good.read_bytes())
    at = flipped.index(b"tensor bytes")
    flipped[at] ^= 0xFF
    damaged = tmp_path / "d.pth"
    damaged.write_bytes(bytes(flipped))
    assert "fails its CRC" in weights_problem(damaged)
    assert "missing" in weights_problem(tmp_path / "none.pth")


def test_only_complete_states_this_attempt_wrote_are_claimed(tmp_path: Path,
                                                             bound: tuple[Path, list[str], Journal]) -> None:
    run_dir, said, journal = bound
    out = tmp_path / "out"
    run = open_run(lora(out=str(out)), tmp_path)
    ledger = bind(run, run_dir, said, journal)
    launched(run, run.plan.copy(), 1, None, run_dir)
    state(out, 5)
    state(out, 10, marker=False)  # cut before prompt_style.yaml
    cut = state(out, 15)
    (cut / "lit_model.pth.lora").write_bytes(b"")  # killed at the `iter 15 step 15` line
    run.states.collect()
    assert [(Path(s.dir).name, s.step) for s in ledger.states] == [("step-000005", 5)]
    assert [e["step"] for e in read_events(run_dir) if e["event"] == "state_saved"] == [5]


def test_finetune_lora_never_resumes_and_restarts_into_an_out_dir_of_its_own(
        tmp_path: Path, bound: tuple[Path, list[str], Journal]) -> None:
    run_dir, said, journal = bound
    out = tmp_path / "out"
    run = open_run(lora(out=str(out)), tmp_path)
    bind(run, run_dir, said, journal)
    assert launched(run, run.plan.copy(), 1, None, run_dir)[3:5] == ["--out_dir", str(out)]
    state(out, 5)
    run.states.collect()
    assert run.states.newest() is None  # no resume option: nothing to resume from
    argv = launched(run, run.plan.copy(), 2, None, run_dir)
    own = run_dir / "attempt-2-out"
    assert argv[argv.index("--out_dir") + 1] == str(own) and "--resume" not in argv
    assert any(n.startswith("finetune_lora cannot resume") and "from the beginning" in n for n in run.notes)
    # its final/ goes to OUT/final, which does not exist yet
    final = own / "final"
    torch_zip(final / "lit_model.pth")
    (final / "prompt_style.yaml").write_text("x")
    assert run.states.final_written()
    assert run.states.publish_final() == str(out / "final")
    assert (out / "final" / "lit_model.pth").read_bytes() == (final / "lit_model.pth").read_bytes()
    assert (final / "lit_model.pth").exists()  # the attempt's own folder stays whole


def test_an_existing_final_is_never_overwritten(tmp_path: Path, bound: tuple[Path, list[str], Journal]) -> None:
    run_dir, said, journal = bound
    out = tmp_path / "out"
    (out / "final").mkdir(parents=True)
    (out / "final" / "lit_model.pth").write_bytes(b"theirs")
    run = open_run(lora(out=str(out)), tmp_path)
    bind(run, run_dir, said, journal)
    argv = launched(run, run.plan.copy(), 1, None, run_dir)
    own = run_dir / "attempt-1-out"
    assert argv[argv.index("--out_dir") + 1] == str(own)  # OUT/final would be overwritten
    torch_zip(own / "final" / "lit_model.pth")
    assert run.states.publish_final() == str(own / "final")
    assert (out / "final" / "lit_model.pth").read_bytes() == b"theirs"
    assert any("stay in" in m for m in said)


def full_run(tmp_path: Path, run_dir: Path, said: list[str], journal: Journal, *extra: str) -> tuple[LitgptRun, Ledger]:
    run = open_run(lora(*extra, sub="finetune_full", out=str(tmp_path / "out")), tmp_path)
    return run, bind(run, run_dir, said, journal)


def test_finetune_full_resumes_from_the_newest_complete_state_by_its_path_and_sets_later_ones_aside(
        tmp_path: Path, bound: tuple[Path, list[str], Journal]) -> None:
    run_dir, said, journal = bound
    out = tmp_path / "out"
    run, ledger = full_run(tmp_path, run_dir, said, journal)
    launched(run, run.plan.copy(), 1, None, run_dir)
    for step in (5, 10):
        state(out, step, "lit_model.pth")
    run.states.collect()
    partial = out / "step-000015"
    partial.mkdir()  # killed right after `Saving checkpoint to '.../step-000015'`
    resume = run.states.newest()
    assert resume is not None and (resume.dir, resume.step) == (str(out / "step-000010"), 10)
    argv = launched(run, run.plan.copy(), 2, resume, run_dir)
    assert argv[argv.index("--resume") + 1] == str(out / "step-000010" / "lit_model.pth")
    assert argv[argv.index("--out_dir") + 1] == str(out)  # the state's own out dir
    assert not partial.exists() and (run_dir / "set-aside" / "attempt-2" / "step-000015").is_dir()
    # the resumed attempt's own step-000015 is claimable under the freed name
    state(out, 15, "lit_model.pth")
    run.states.collect()
    assert [s.step for s in ledger.states] == [5, 10, 15]


def test_a_schedule_remedy_on_finetune_full_starts_fresh_never_from_a_state_of_the_old_schedule(
        tmp_path: Path, bound: tuple[Path, list[str], Journal]) -> None:
    run_dir, said, journal = bound
    out = tmp_path / "out"
    run, _ledger = full_run(tmp_path, run_dir, said, journal, "--train.lr_warmup_steps", "20")
    launched(run, run.plan.copy(), 1, None, run_dir)
    state(out, 5, "lit_model.pth")
    run.states.collect()
    plan = run.plan.copy()
    run.apply(plan, Action("add_flag", "train.lr_warmup_steps"))
    assert run.states.newest(plan=plan) is None  # step 5 carries the old schedule
    argv = launched(run, plan.copy(), 2, None, run_dir)
    assert "--resume" not in argv and argv[argv.index("--out_dir") + 1] == str(run_dir / "attempt-2-out")
    state(run_dir / "attempt-2-out", 5, "lit_model.pth")
    run.states.collect()
    resume = run.states.newest()  # the corrected line's own state is resumable
    assert resume is not None and resume.dir == str(run_dir / "attempt-2-out" / "step-000005")
    again = launched(run, plan.copy(), 3, resume, run_dir)
    assert again[again.index("--out_dir") + 1] == str(run_dir / "attempt-2-out")


def test_a_users_resume_auto_becomes_the_newest_complete_states_path_or_goes(
        tmp_path: Path, bound: tuple[Path, list[str], Journal]) -> None:
    run_dir, said, journal = bound
    out = tmp_path / "out"
    state(out, 5, "lit_model.pth")
    cut = state(out, 10, "lit_model.pth")
    (cut / "lit_model.pth").write_bytes(b"PK\x03\x04 truncated")  # LitGPT's `auto` would take this one
    run, _ledger = full_run(tmp_path, run_dir, said, journal, "--resume", "auto")
    assert run.user_resume == out / "step-000005"
    assert run.states.adopt(out / "step-000005") == ""
    resume = run.states.newest()
    assert resume is not None
    argv = launched(run, run.plan.copy(), 1, resume, run_dir)
    assert argv[argv.index("--resume") + 1] == str(out / "step-000005" / "lit_model.pth")
    assert argv.count("--resume") == 1 and "auto" not in argv
    fresh = open_run(lora("--resume", "auto", sub="finetune_full", out=str(tmp_path / "empty")), tmp_path)
    assert fresh.user_resume is None and any("removes --resume" in n for n in fresh.notes)
    fresh.bind(run_dir, Ledger(run_dir / "l2.json"), journal, said.append)
    assert "--resume" not in launched(fresh, fresh.plan.copy(), 1, None, run_dir)


def test_adapter_v2_never_restarts_into_an_out_dir_holding_adapter_files(
        tmp_path: Path, bound: tuple[Path, list[str], Journal]) -> None:
    run_dir, said, journal = bound
    run = open_run(lora("--resume", "true", sub="finetune_adapter_v2", out=str(tmp_path / "out")), tmp_path)
    bind(run, run_dir, said, journal)
    assert any("does not load the saved adapter" in n for n in run.notes)
    old = run_dir / "attempt-9-out" / "step-000020"
    torch_zip(old / "lit_model.pth.adapter_v2")  # an earlier run's, below OUT: its step count would start at 20
    argv = launched(run, run.plan.copy(), 1, None, run_dir)
    assert "--resume" not in argv and argv[argv.index("--out_dir") + 1] == str(run_dir / "attempt-1-out")


# --- doctor, interpreter -----------------------------------------------------------------------

def model_dir(tmp_path: Path) -> Path:
    ckpt = tmp_path / "checkpoints" / "tiny-gpt"
    ckpt.mkdir(parents=True)
    for name in ("lit_model.pth", "model_config.yaml", "tokenizer.json", "tokenizer_config.json"):
        (ckpt / name).write_text("x")
    return ckpt


def findings(argv: list[str], cwd: Path) -> dict[str, tuple[str, str, str]]:
    return {f.id: (f.severity, f.message, f.fix) for f in open_run(argv, cwd).doctor({})}


def test_doctor_on_the_working_command_says_lora_cannot_resume(tmp_path: Path) -> None:
    ckpt = model_dir(tmp_path)
    found = findings(["litgpt", "finetune_lora", str(ckpt), "--train.max_steps", "20", "--train.lr_warmup_steps", "2"],
                     tmp_path)
    assert {k: v[0] for k, v in found.items()} == {"no_resume": "warning", "checkpoint_dir": "info"}
    assert "finetune_lora cannot resume" in found["no_resume"][1]
    assert findings(["litgpt", "finetune_full", str(ckpt)], tmp_path)["resume"][0] == "info"


def test_doctor_blockers_schedule_precision_and_checkpoint_dir(tmp_path: Path) -> None:
    ckpt = model_dir(tmp_path)
    found = findings(["litgpt", "finetune_lora", str(ckpt), "--train.max_steps", "20", "--train.lr_warmup_steps", "20",
                      "--precision", "fp32"], tmp_path)
    assert found["lr_warmup_too_long"][0] == "blocker" and found["lr_warmup_too_long"][2].startswith(
        "--train.lr_warmup_steps 19")
    assert found["precision"][0] == "blocker" and "32-true" in found["precision"][1]
    # LitGPT's own default warmup is 100 steps: a 20-step run without the flag dies the same way
    assert "lr_warmup_too_long" in findings(["litgpt", "finetune_lora", str(ckpt), "--train.max_steps", "20"], tmp_path)
    assert findings(["litgpt", "finetune_lora", str(ckpt), "--train.lr_warmup_steps", "0"],
                    tmp_path)["lr_warmup_zero"][0] == "blocker"
    assert findings(["litgpt", "finetune_lora", str(tmp_path / "nope")], tmp_path)["checkpoint_missing"][0] == "blocker"
    (ckpt / "tokenizer.json").unlink()
    assert "tokenizer.json or tokenizer.model" in findings(["litgpt", "finetune_lora", str(ckpt)],
                                                           tmp_path)["checkpoint_files"][1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert findings(["litgpt", "finetune_lora", "tiny-gpt"], elsewhere)["checkpoint_relative"][0] == "blocker"


def test_the_interpreter_is_the_console_scripts_shebang(tmp_path: Path) -> None:
    script = tmp_path / "venv" / "bin" / "litgpt"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!{tmp_path}/venv/bin/python\nimport sys\n")
    run = open_run([str(script), "finetune_lora", CKPT], tmp_path)
    assert run.python({"PATH": "/usr/bin"}) == f"{tmp_path}/venv/bin/python"
    assert open_run(["/usr/bin/python3", "-m", "litgpt", "finetune_lora", CKPT],
                    tmp_path).python({}) == "/usr/bin/python3"


def test_ledger_json_of_a_run_is_plain_data(tmp_path: Path, bound: tuple[Path, list[str], Journal]) -> None:
    run_dir, said, journal = bound
    run = open_run(lora(out=str(tmp_path / "out")), tmp_path)
    bind(run, run_dir, said, journal)
    launched(run, run.plan.copy(), 1, None, run_dir)
    assert json.loads((run_dir / "ledger.json").read_text())["attempts"][0]["resume_step"] == 0


def test_a_resumable_run_that_would_save_no_state_gets_a_save_interval(tmp_path: Path) -> None:
    run = open_run(["litgpt", "finetune_full", CKPT, "--train.max_steps", "200"], tmp_path)
    assert (run.plan.value("train.save_interval") == "20"
            and any("--train.save_interval 20 added" in n for n in run.notes))
    assert open_run(["litgpt", "finetune_lora", CKPT, "--train.max_steps", "200"], tmp_path).plan.value(
        "train.save_interval") is None  # LoRA cannot resume: its states would not help
    assert open_run(lora(sub="finetune_full"), tmp_path).plan.value("train.save_interval") == "5"  # the user's


def test_diagnose_gets_litgpts_wording_but_never_a_bare_assertion_of_an_unknown_trainer() -> None:
    from trainsup.trainers.registry import family_rules
    ids = {r.id for r in family_rules()}
    assert {"lr_schedule", "sequence_too_long"} <= ids
    assert not any(r.patterns == (r"^AssertionError$",) for r in family_rules())
    assert any(r.patterns == (r"^AssertionError$",) for r in open_run(lora(), Path("/")).rules())
