"""The OneTrainer adapter, pure: recognising the command, the derived config, backups made here on
disk (complete, cut short, not finite), clearing ``backup/`` for a resume, the ladders, the fault
rules and the progress lines. Lines are modelled, in our own words, on what the real trainer printed
on the CPU bed (``../shared/realonetrainer/README.md``)."""

from __future__ import annotations

import json
import os
import signal
import struct
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contract.kit import launched
from trainsup.adapters.onetrainer.adapter import FAMILY, OneTrainerRun
from trainsup.adapters.onetrainer.backups import backup_problem, parse_name
from trainsup.adapters.onetrainer.output import OTOutput
from trainsup.adapters.onetrainer.rules import RULES
from trainsup.faults.remedies import Action
from trainsup.faults.rules import BUILTIN_RULES
from trainsup.faults.scanner import FaultScanner
from trainsup.record.journal import Journal, read_events
from trainsup.record.ledger import Ledger
from trainsup.trainers.base import Setup, UsageError, rung_applies
from trainsup.trainers.registry import choose

PY = "/bed/venv/bin/python"


def config(tmp: Path, **extra: object) -> Path:
    concepts = tmp / "concepts.json"
    samples = tmp / "samples.json"
    concepts.write_text(json.dumps([{"name": "c", "path": str(tmp / "images"), "seed": 1}]))
    samples.write_text(json.dumps([{"prompt": "a cat", "height": 64, "width": 64}]))
    doc: dict[str, object] = {
        "__version": 11, "training_method": "LORA", "model_type": "STABLE_DIFFUSION_15",
        "workspace_dir": str(tmp / "ws"), "cache_dir": str(tmp / "cache"),
        "output_model_destination": str(tmp / "lora.safetensors"), "output_model_format": "KOHYA_LORA",
        "epochs": 3, "batch_size": 2, "gradient_accumulation_steps": 1, "learning_rate": 0.0003,
        "backup_after": 5, "backup_after_unit": "STEP", "lora_rank": 4, "lora_alpha": 1.0,
        "latent_caching": True, "train_device": "cuda", "temp_device": "cpu",
        "concept_file_name": str(concepts), "sample_definition_file_name": str(samples),
        "optimizer": {"optimizer": "ADAMW_8BIT"}, "unet": {"gradient_checkpointing": False},
    }
    doc.update(extra)
    path = tmp / "config.json"
    path.write_text(json.dumps(doc, indent=2))
    return path


def argv(cfg: Path, *extra: str) -> list[str]:
    return [PY, "scripts/train.py", "--config-path", str(cfg), *extra]


def open_run(args: list[str], cwd: Path) -> OneTrainerRun:
    run = FAMILY.open(Setup(tuple(args), cwd))
    assert isinstance(run, OneTrainerRun)
    return run


@pytest.fixture
def bound(tmp_path: Path) -> Iterator[tuple[OneTrainerRun, Path, Ledger, Journal, list[str]]]:
    cfg = config(tmp_path)
    run = open_run(argv(cfg), tmp_path)
    run_dir = tmp_path / "ws" / ".trainsup"
    run_dir.mkdir(parents=True)
    journal = Journal(run_dir)
    ledger = Ledger(run_dir / "ledger.json")
    said: list[str] = []
    run.bind(run_dir, ledger, journal, said.append)
    yield run, run_dir, ledger, journal, said
    journal.close()


def safetensors(path: Path, values: list[float]) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]}})
    raw = header.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + struct.pack(f"<{len(values)}f", *values))


def backup(ws: Path, step: int, epoch: int, estep: int, ts: str = "2026-01-01_00-00-00", *,
           values: tuple[float, ...] = (0.5, -1.0), upto: str = "samples", rank: int = 4) -> Path:
    """A backup directory as OneTrainer writes it, stopped after the file ``upto`` names."""
    path = ws / "backup" / f"{ts}-backup-{step}-{epoch}-{estep}"
    safetensors(path / "lora" / "lora.safetensors", list(values))
    if upto == "lora":
        return path
    (path / "optimizer").mkdir()
    with zipfile.ZipFile(path / "optimizer" / "optimizer.pt", "w") as z:
        z.writestr("archive/data.pkl", b"state" * 100)
    if upto == "optimizer":
        return path
    (path / "meta.json").write_text(json.dumps({"train_progress": {"global_step": step, "epoch": epoch}}))
    (path / "onetrainer_config").mkdir()
    (path / "onetrainer_config" / "args.json").write_text(json.dumps({"lora_rank": rank, "lora_alpha": 1.0}))
    (path / "onetrainer_config" / "concepts.json").write_text("[]")
    if upto == "concepts":
        return path
    (path / "onetrainer_config" / "samples.json").write_text("[]")
    return path


# --- detection and the plan ---------------------------------------------------------------------
def test_detects_train_py_with_any_python_and_the_registry_chooses_it(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert FAMILY.detect(argv(cfg)) == 10
    assert FAMILY.detect(["python3", "scripts/train.py", "--config-path", "x.json"]) == 10
    assert FAMILY.detect(["python", "/opt/OneTrainer/scripts/train.py", "--config-path=x.json"]) == 10
    assert FAMILY.detect(["python", "train.py", "--config-path", "x.json"]) == 0
    assert FAMILY.detect(["accelerate", "launch", "train_network.py"]) == 0
    assert choose(argv(cfg)).name == "onetrainer"


def test_missing_config_path_or_unreadable_config_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--config-path"):
        open_run([PY, "scripts/train.py"], tmp_path)
    with pytest.raises(UsageError, match="cannot read"):
        open_run(argv(tmp_path / "nope.json"), tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  'x': 1\n}")
    with pytest.raises(UsageError, match="bad.json:2: not valid JSON"):
        open_run(argv(bad), tmp_path)


def test_settings_resolve_like_train_py_config_values_win(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    run = open_run(argv(cfg, "--config-value", "epochs=5", "--config-value=workspace_dir=/elsewhere/ws"), tmp_path)
    assert run.epochs == 5
    assert run.workspace == Path("/elsewhere/ws")
    assert run.default_run_dir(tmp_path) == Path("/elsewhere/ws/.trainsup")
    assert run.model_out == tmp_path / "lora.safetensors"
    assert run.plan.value("optimizer.optimizer") == "ADAMW_8BIT"


def test_launch_writes_a_derived_config_and_leaves_the_users_files_byte_identical(
        bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]], tmp_path: Path) -> None:
    run, run_dir, _, _, _ = bound
    before = {p: p.read_bytes() for p in tmp_path.glob("*.json")}
    plan = run.plan.copy()
    assert run.apply(plan, Action("add_flag", "latent_caching", "false")) == "latent_caching: false (was True)"
    args = launched(run, plan, 1, None, run_dir)
    derived = run_dir / "attempt-1" / "config.json"
    assert args == [PY, "scripts/train.py", "--config-path", str(derived)]
    doc = json.loads(derived.read_text())
    assert doc["latent_caching"] is False and doc["continue_last_backup"] is False
    assert doc["concept_file_name"] == str(run_dir / "attempt-1" / "concepts.json")
    assert (run_dir / "attempt-1" / "samples.json").read_bytes() == (tmp_path / "samples.json").read_bytes()
    assert plan.env["PYTHONUNBUFFERED"] == "1"
    assert {p: p.read_bytes() for p in tmp_path.glob("*.json")} == before
    assert run.command_line(plan)[-2:] == ["--config-value", "latent_caching=false"]


def test_a_remedied_key_drops_the_users_config_value_of_it(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    run = open_run(argv(cfg, "--config-value", "latent_caching=true", "--config-value", "epochs=1"), tmp_path)
    plan = run.plan.copy()
    run.apply(plan, Action("add_flag", "latent_caching", "false"))
    out = plan.launch_argv(tmp_path / "d.json", set(plan.overrides))
    assert out == [PY, "scripts/train.py", "--config-value", "epochs=1", "--config-path", str(tmp_path / "d.json")]


# --- backups ---------------------------------------------------------------------------------
def test_backup_names_and_completeness_at_each_cut(tmp_path: Path) -> None:
    assert parse_name("2026-08-19_10-00-00-backup-9-1-1") is not None
    assert parse_name("backup-9-1-1") is None
    ws = tmp_path / "ws"
    assert backup_problem(backup(ws, 4, 0, 4)) == ""
    assert "meta.json missing" in backup_problem(backup(ws, 9, 1, 1, "2026-01-01_00-00-01", upto="optimizer"))
    assert "samples.json missing" in backup_problem(backup(ws, 9, 1, 1, "2026-01-01_00-00-02", upto="concepts"))
    assert "meta.json" in backup_problem(backup(ws, 9, 1, 1, "2026-01-01_00-00-03", upto="lora"))
    nan = backup(ws, 14, 1, 6, "2026-01-01_00-00-04", values=(1.0, float("nan")))
    assert "NaN or inf" in backup_problem(nan)
    cut = backup(ws, 19, 2, 3, "2026-01-01_00-00-05")
    opt = cut / "optimizer" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:40])
    assert "optimizer.pt" in backup_problem(cut)
    lora = backup(ws, 19, 2, 3, "2026-01-01_00-00-06") / "lora" / "lora.safetensors"
    lora.write_bytes(lora.read_bytes()[:-3])
    assert "cut short" in backup_problem(lora.parent.parent)
    meta = backup(ws, 19, 2, 3, "2026-01-01_00-00-07") / "meta.json"
    meta.write_text("")
    assert "meta.json not valid JSON" in backup_problem(meta.parent)


def test_states_claim_complete_backups_and_never_resume_the_end_backup(
        bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]], tmp_path: Path) -> None:
    run, run_dir, _ledger, _, _ = bound
    launched(run, run.plan.copy(), 1, None, run_dir)
    ws = tmp_path / "ws"
    backup(ws, 4, 0, 4, "2026-01-01_00-00-01")
    backup(ws, 9, 1, 1, "2026-01-01_00-00-02", upto="optimizer")  # cut short
    backup(ws, 24, 3, 0, "2026-01-01_00-00-03")  # the end backup (epoch == epochs)
    claimed = run.states.collect()
    assert [s.step for s in claimed] == [4, 24]
    newest = run.states.newest()
    assert newest is not None and newest.step == 4


def test_a_resume_moves_partial_and_later_backups_aside_and_takes_the_backups_rank(
        bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]], tmp_path: Path) -> None:
    run, run_dir, ledger, journal, _said = bound
    launched(run, run.plan.copy(), 1, None, run_dir)
    ws = tmp_path / "ws"
    b4 = backup(ws, 4, 0, 4, "2026-01-01_00-00-01", rank=8)
    b9 = backup(ws, 9, 1, 1, "2026-01-01_00-00-02")
    partial_old = backup(ws, 2, 0, 2, "2026-01-01_00-00-00", upto="lora")
    partial_new = backup(ws, 14, 1, 6, "2026-01-01_00-00-03", upto="concepts")
    run.states.collect()
    state = next(s for s in ledger.states if s.dir == str(b4))
    args = launched(run, run.plan.copy(), 2, state, run_dir)
    assert sorted(p.name for p in (ws / "backup").iterdir()) == [b4.name]
    aside = run_dir / "set-aside" / "attempt-2"
    assert sorted(p.name for p in aside.iterdir()) == sorted([b9.name, partial_old.name, partial_new.name])
    doc = json.loads(Path(args[-1]).read_text())
    assert doc["continue_last_backup"] is True and doc["lora_rank"] == 8
    journal.close()
    events = [e for e in read_events(run_dir) if e["event"] == "state_set_aside"]
    assert len(events) == 3


def test_a_second_backup_of_the_resumed_step_is_moved_out_of_sight_and_the_first_stays_the_resume_point(
        bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]], tmp_path: Path) -> None:
    run, run_dir, ledger, journal, _ = bound
    launched(run, run.plan.copy(), 1, None, run_dir)
    ws = tmp_path / "ws"
    first = backup(ws, 9, 1, 1, "2026-01-01_00-00-01")
    run.states.collect()
    launched(run, run.plan.copy(), 2, run.states.newest(), run_dir)
    again = backup(ws, 9, 1, 1, "2026-01-01_00-00-09")  # OneTrainer backs up the resumed step again
    os.utime(again / "meta.json", (time.time() + 5, time.time() + 5))
    later = backup(ws, 14, 1, 6, "2026-01-01_00-00-10")
    os.utime(later / "meta.json", (time.time() + 5, time.time() + 5))
    run.states.collect()
    # backup/ lists what an uninterrupted run makes: one backup of step 9, then 14
    assert sorted(p.name for p in (ws / "backup").iterdir()) == [first.name, later.name]
    hidden = run_dir / "saves" / again.name
    assert (hidden / "meta.json").is_file()  # moved whole, never deleted
    assert str(hidden) in [s.dir for s in ledger.states]  # the ledger follows it
    journal.close()
    [event] = [e for e in read_events(run_dir) if e["event"] == "save_hidden"]
    assert (event["dir"], event["to"], event["step"]) == (str(again), str(hidden), 9)
    # A later resume never picks the hidden copy: OneTrainer resumes from backup/ only.
    ledger.states = [s for s in ledger.states if s.step == 9]
    newest = run.states.newest()
    assert newest is not None and newest.dir == str(first)


def test_success_needs_saving_of_the_model_and_its_file_written_this_attempt(
        bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]], tmp_path: Path) -> None:
    run, run_dir, _, _, _ = bound
    launched(run, run.plan.copy(), 1, None, run_dir)
    model = tmp_path / "lora.safetensors"
    model.write_bytes(b"x")
    assert not run.states.final_written()  # no Saving line yet
    run.output.state_completed(f"Saving {model}")
    assert run.states.final_written()


# --- output ----------------------------------------------------------------------------------
BAR = "step:  50%|#####     | {n}/8 [00:03<00:03,  1.25it/s, loss=1.16, smooth loss=1.1]\x1b[A"


def test_the_true_step_from_the_epoch_and_step_bars_and_the_resumed_epoch() -> None:
    out = OTOutput()
    out.begin(1, "/m.safetensors")  # resumed from a backup of epoch 1
    out.state_completed("epoch:   0%|          | 0/2 [00:00<?, ?it/s]")
    p = out.progress(BAR.format(n=3))
    assert p is not None and (p.step, p.total, p.loss) == (11, 24, 1.16)
    assert p.rate == pytest.approx(1.25)
    out.state_completed("\repoch:  50%|#####     | 1/2 [00:10<00:10, 10.0s/it]")
    p = out.progress("step:   0%|          | 0/8 [00:00<?, ?it/s]")
    assert p is not None and p.step == 16
    assert out.progress("validation_step: 100%|##| 1/1 [00:00<00:00]") is None
    slow = out.progress("step:  12%|#   | 1/8 [00:01<00:07,  2.00s/it, loss=nan, smooth loss=nan]")
    assert slow is not None and slow.rate == pytest.approx(0.5)


def test_the_last_step_bar_and_the_epoch_bar_after_it_in_one_read_give_the_last_step_not_an_epoch_more() -> None:
    """Seen on the real bed: a resumed attempt's closing `step 8/8` redraw and the `epoch 1/1` tick
    reached trainsup in one read; the step is 16 of 16, not 24."""
    from trainsup.faults.scanner import FaultScanner
    from trainsup.run.events import ProgressSeen, new_queue
    from trainsup.run.observe import OutputParser

    events = new_queue()
    fmt = OTOutput()
    fmt.begin(1, "/m.safetensors")  # resumed in epoch 1 of 2
    parser = OutputParser(events, FaultScanner(), clock=lambda: 1.0, fmt=fmt)
    parser.feed("stderr", b"epoch:   0%|          | 0/1 [00:00<?, ?it/s]\n")
    parser.feed("stderr", (BAR.format(n=7) + "\r" + BAR.format(n=8).replace("\x1b[A", "") + "\n\n"
                           "epoch: 100%|##########| 1/1 [00:06<00:00,  6.34s/it]\n").encode())
    steps = [e.progress.step for e in (events.get() for _ in range(events.qsize())) if isinstance(e, ProgressSeen)]
    assert steps and steps[-1] == 16 and max(steps) == 16, steps


def test_a_bar_with_a_glued_traceback_is_not_a_plain_redraw() -> None:
    out = OTOutput()
    assert out.is_plain_redraw(BAR.format(n=4))
    assert not out.is_plain_redraw(BAR.format(n=4) + "Traceback (most recent call last):")
    out.state_completed("Creating Backup /w/backup/2026-01-01_00-00-00-backup-9-1-1")
    assert out.last_backup_step == 9


# --- rules and ladders -------------------------------------------------------------------------
def scan(lines: list[str]) -> str | None:
    scanner = FaultScanner((*RULES, *BUILTIN_RULES))
    for i, line in enumerate(lines, 1):
        scanner.feed(line, i)
    return scanner.verdict.fault if scanner.verdict else None


def tb(*frames: tuple[str, str], last: str) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for file, func in frames:
        lines += [f'  File "/ot/{file}", line 10, in {func}', "    something()"]
    return [*lines, last]


def test_rules_name_onetrainers_faults() -> None:
    assert scan(tb(("train.py", "main"), ("GenericTrainer.py", "start"), ("create.py", "create_optimizer"),
                   last="ModuleNotFoundError: No module named 'bitsandbytes'")) == "optimizer_backend"
    assert scan(tb(("GenericTrainer.py", "end"), ("LoRAModelSaver.py", "save"),
                   last="NotImplementedError: Unsupported LoRA output format: SAFETENSORS")) == "output_format"
    assert scan(tb(("GenericTrainer.py", "train"), last="RuntimeError: Training loss became NaN. This may be "
                   "due to invalid parameters.")) == "nan_loss"
    assert scan(tb(("TrainConfig.py", "__migration_9"), last="KeyError: 'weight_dtype'")) == "config_error"
    assert scan(tb(("GenericTrainer.py", "train"), last="RuntimeError: Expected all tensors to be on the same "
                   "device, but found at least two devices, cuda:0 and cpu!")) == "device_mismatch"


def test_device_mismatch_ladder_in_onetrainer_keys(
        bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]]) -> None:
    run, *_ = bound
    plan = run.plan.copy()
    rungs = run.ladder("device_mismatch")
    changes = [run.apply(plan, rung.actions[0]) for rung in rungs[:3]]
    assert changes == ["latent_caching: false (was True)", "temp_device: cuda (was cpu)",
                       "validation: false (was False)"] or changes[2] is None
    assert plan.overrides == {"latent_caching": False, "temp_device": "cuda"}
    assert rungs[-1].actions[0].kind == "stop"
    assert not rung_applies(run, run.plan.copy(), rungs[0].__class__((Action("remove_flag", "cache_latents"),)))


def test_cuda_oom_ladder_checkpointing_batch_offload_and_no_float8_for_sd15(
        bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]]) -> None:
    run, *_ = bound
    plan = run.plan.copy()
    out = [run.apply(plan, rung.actions[0]) for rung in run.ladder("cuda_oom")[:4]]
    assert out[0] == "unet.gradient_checkpointing: true"
    assert out[1] == "batch_size: 1 (was 2), gradient_accumulation_steps: 2 (was 1)"
    assert out[2] == "unet.activation_offloading: true, unet.offload_fraction: 0.5"
    assert out[3] is None  # SD 1.5: no float8 rung
    flux = run.plan.copy()
    flux.set("model_type", "FLUX_DEV_1")
    assert run.apply(flux, Action("add_flag", "weight_dtype", "FLOAT_8")) == "unet.weight_dtype: FLOAT_8"


def test_optimizer_and_output_format_ladders(bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]]) -> None:
    run, *_ = bound
    plan = run.plan.copy()
    assert run.apply(plan, run.ladder("optimizer_backend")[0].actions[0]) == \
        "optimizer.optimizer: ADAMW (was ADAMW_8BIT)"
    assert run.apply(plan, run.ladder("output_format")[0].actions[0]) is None  # already KOHYA_LORA
    assert plan.derived()["optimizer"] == {"optimizer": "ADAMW"}


def test_nan_lowers_the_lr_and_skips_the_backup_saved_right_before_it(
        bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]], tmp_path: Path) -> None:
    run, run_dir, _ledger, _, _ = bound
    launched(run, run.plan.copy(), 1, None, run_dir)
    ws = tmp_path / "ws"
    backup(ws, 4, 0, 4, "2026-01-01_00-00-01")
    backup(ws, 9, 1, 1, "2026-01-01_00-00-02")
    run.states.collect()
    run.output.state_completed("Creating Backup " + str(ws / "backup" / "2026-01-01_00-00-02-backup-9-1-1"))
    plan = run.plan.copy()
    change = run.apply(plan, run.ladder("nan_loss")[0].actions[0])
    assert change is not None and change.startswith("learning_rate: 3e-05 (was 0.0003)")
    newest = run.states.newest(plan=plan)  # the remedied plan's resume point
    assert newest is not None and newest.step == 4
    launched(run, plan, 2, newest, run_dir)  # a later attempt's backups are fine again
    later = backup(ws, 14, 1, 6, "2026-01-01_00-00-05")
    run.states.collect()
    assert run.states.newest() is not None and run.states.newest().dir == str(later)  # type: ignore[union-attr]


def test_config_error_names_the_key(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    doc = json.loads(cfg.read_text())
    del doc["__version"]
    cfg.write_text(json.dumps(doc))
    run = open_run(argv(cfg), tmp_path)
    assert "__version" in (run.ladder("config_error")[0].actions[0].value or "")
    (tmp_path / "concepts.json").unlink()
    doc["__version"] = 11
    cfg.write_text(json.dumps(doc))
    run = open_run(argv(cfg), tmp_path)
    assert "concept_file_name" in (run.ladder("config_error")[0].actions[0].value or "")


def test_planned_stops_use_sigint(tmp_path: Path) -> None:
    run = open_run(argv(config(tmp_path)), tmp_path)
    assert run.planned_stop_signal == signal.SIGINT


# --- inputs and doctor -------------------------------------------------------------------------
def test_edits_are_validated_and_applied_at_the_next_backup(
        bound: tuple[OneTrainerRun, Path, Ledger, Journal, list[str]], tmp_path: Path) -> None:
    run, run_dir, _, _, said = bound
    plan = run.plan.copy()
    samples = tmp_path / "samples.json"
    samples.write_text("[{'prompt': 1}]")
    assert run.inputs.on_change(samples, "modified", plan) == "none"
    assert any("samples.json" in s and "is not applied" in s for s in said)
    samples.write_text('[{"prompt": "a dog"}]')
    assert run.inputs.on_change(samples, "modified", plan) == "at_checkpoint"
    cfg = tmp_path / "config.json"
    doc = json.loads(cfg.read_text())
    doc["lora_rank"] = 16
    cfg.write_text(json.dumps(doc))
    assert run.inputs.on_change(cfg, "modified", plan) == "none"  # a backup fixes the rank
    doc["lora_rank"], doc["learning_rate"] = 4, 0.0001
    cfg.write_text(json.dumps(doc))
    assert run.inputs.on_change(cfg, "modified", plan) == "at_checkpoint"
    launched(run, plan, 3, None, run_dir)
    derived = json.loads((run_dir / "attempt-3" / "config.json").read_text())
    assert derived["learning_rate"] == 0.0001
    assert json.loads((run_dir / "attempt-3" / "samples.json").read_text()) == [{"prompt": "a dog"}]


def test_doctor_findings(tmp_path: Path) -> None:
    cfg = config(tmp_path, output_model_format="SAFETENSORS", backup_after_unit="NEVER")
    run = open_run(argv(cfg), tmp_path)
    ids = {f.id for f in run.doctor({})}
    assert {"output_format", "no_backups", "cwd"} <= ids
    (tmp_path / "samples.json").write_text("{oops")
    assert "sample_definition_file_name" in {f.id for f in open_run(argv(cfg), tmp_path).doctor({})}


# --- diagnose --------------------------------------------------------------------------------------
def test_diagnose_reads_a_onetrainer_log_with_every_familys_rules_and_corrects_its_command(tmp_path: Path) -> None:
    import io

    from trainsup.commands.diagnose import diagnose_scan
    from trainsup.faults.logscan import scan_log
    from trainsup.trainers.registry import family_rules

    cfg = config(tmp_path)
    log = "\n".join(["Creating Backup /ws/backup/2026-01-01_00-00-00-backup-4-0-4",
                     BAR.format(n=5), *tb(("train.py", "main"), ("GenericTrainer.py", "train"),
                                        last="RuntimeError: Expected all tensors to be on the same device, but "
                                        "found at least two devices, cuda:0 and cpu!")]).encode() + b"\n"
    rules = (*family_rules(), *BUILTIN_RULES)
    d = diagnose_scan("ot.log", scan_log(io.BytesIO(log), rules), rules, command=argv(cfg))
    assert d.fault == "device_mismatch"
    assert d.remedy == ["latent_caching: false (was True)"]
    assert d.command is not None and d.command.endswith("--config-value latent_caching=false")
    nan = "\n".join(tb(("GenericTrainer.py", "train"), last="RuntimeError: Training loss became NaN. This may be "
                       "due to invalid parameters.")).encode() + b"\n"
    assert diagnose_scan("nan.log", scan_log(io.BytesIO(nan), rules), rules).fault == "nan_loss"
