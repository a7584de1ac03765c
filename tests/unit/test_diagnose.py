"""What diagnose says trainsup run would change: the first applicable rung, applied to a command."""

from __future__ import annotations

import functools
import io
from pathlib import Path

from trainsup.commands.diagnose import build_plan, command_text, diagnose_scan, format_text, plan_remedy
from trainsup.faults import logscan
from trainsup.faults.rules import BUILTIN_RULES
from trainsup.faults.verdict import Said
from trainsup.trainers.registry import family_rules, known_output

# A log of any trainer is read as ``diagnose`` reads it: with every adapter's output format (its
# progress lines drop evidence training outlived; its success line).
KNOWN = known_output()
scan_log = functools.partial(logscan.scan_log, progress=KNOWN)


FLUX = "accelerate launch flux_train_network.py --output_dir o --network_dim 16".split()
SD = "accelerate launch train_network.py --output_dir o".split()


def test_the_first_rung_that_changes_the_command_is_chosen() -> None:
    with_cache = build_plan([*SD, "--cache_latents", "--cache_latents_to_disk"])
    remedy = plan_remedy("device_mismatch", with_cache)
    assert remedy.changes == ["remove --cache_latents", "remove --cache_latents_to_disk"]
    assert remedy.plan is not None and not remedy.plan.plan.command.has("cache_latents")
    te_only = build_plan([*FLUX, "--cache_text_encoder_outputs"])
    assert plan_remedy("device_mismatch", te_only).changes == ["remove --cache_text_encoder_outputs"]
    neither = plan_remedy("device_mismatch", build_plan(SD))
    assert not neither.relaunch and neither.changes[0].startswith("stop: tensors are still on two devices")


def test_fp8_base_is_added_with_mixed_precision_and_never_where_it_is_already_on() -> None:
    remedy = plan_remedy("meta_tensor", build_plan(FLUX))
    assert remedy.plan is not None
    assert command_text(remedy.plan).endswith("--fp8_base --mixed_precision bf16")
    again = plan_remedy("meta_tensor", build_plan([*FLUX, "--fp8_base", "--mixed_precision", "bf16"]))
    assert not again.relaunch and "key layout" in again.changes[0]


def test_environment_changes_prefix_the_command_line() -> None:
    remedy = plan_remedy("cuda_oom", build_plan(SD))
    assert remedy.changes == ["set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
    assert remedy.plan is not None
    assert command_text(remedy.plan) == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True " + " ".join(SD)


def test_faults_a_restart_cannot_fix_stop_at_once() -> None:
    for fault in ("config_error", "missing_dependency", "disk_full"):
        remedy = plan_remedy(fault, build_plan(SD))
        assert not remedy.relaunch and remedy.changes[0].startswith("stop: ")


def test_serializer_upgrade_names_the_trainers_python() -> None:
    plan = build_plan(["/venv/bin/python", "flux_train_network.py", "--fp8_base"])
    assert plan_remedy("fp8_serializer", plan).changes == [
        ("upgrade safetensors>=0.4.2 in the trainer's interpreter: /venv/bin/python -m pip install "
        "'safetensors>=0.4.2'")]
    resume = plan_remedy("fp8_serializer", plan,
                         Said("TypeError: load_model() got an unexpected keyword argument 'device'"))
    assert "'safetensors>=0.4.3'" in resume.changes[0]
    forbidden = plan_remedy("fp8_serializer", plan, allow_upgrade=False)
    assert not forbidden.relaunch and forbidden.changes == [
        ("stop: the policy forbids upgrades (environment.allow_upgrade: false); run: /venv/bin/python -m pip install "
        "'safetensors>=0.4.2'")]


def test_without_a_command_the_first_rung_is_described() -> None:
    # No trainer known: the neutral ladder, in no trainer's flags; a kohya command gets kohya's wording.
    assert plan_remedy("host_oom_killed", None).changes == ["lower the DataLoader workers (to half)"]
    assert plan_remedy("host_oom_killed", build_plan(SD)).changes == ["--max_data_loader_n_workers 4"]
    assert plan_remedy("unknown", None).changes == ["restart from the last safe state"]
    assert plan_remedy("my_user_fault", None).changes == ["restart from the last safe state"]


def test_a_config_file_set_flag_is_removed_through_a_note(tmp_path: Path) -> None:
    config = tmp_path / "cfg.toml"
    config.write_text("[train]\ncache_latents = true\n", encoding="utf-8")
    log = b"RuntimeError: Expected all tensors to be on the same device, but found at least two devices\n"
    d = diagnose_scan("x.log", scan_log(io.BytesIO(log)), command=[*SD, "--config_file", str(config)])
    assert d.remedy == [f"remove --cache_latents (set in {config}; a derived copy drops it)"]
    assert any("remove it there too" in n for n in d.notes)
    missing = diagnose_scan("x.log", scan_log(io.BytesIO(log)), command=[*SD, "--config_file", "/nowhere.toml"])
    assert missing.remedy == ["remove --cache_latents", "remove --cache_latents_to_disk"]
    assert any("not readable here" in n for n in missing.notes)


def test_text_output_of_a_clean_a_failed_and_an_unknown_log() -> None:
    clean = diagnose_scan("ok.log", scan_log(io.BytesIO(b"epoch 1/1\nmodel saved.\n")))
    assert format_text(clean) == "ok.log: no fault: the run finished (its trainer's success line)"
    oom = b"torch.OutOfMemoryError: CUDA out of memory.\n"
    text = format_text(diagnose_scan("oom.log", scan_log(io.BytesIO(oom)), command=SD))
    assert text.splitlines() == [
        "oom.log: cuda_oom at line 1",
        "  evidence: torch.OutOfMemoryError: CUDA out of memory.",
        "  why: The GPU ran out of memory.",
        "  trainsup run would: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "  corrected command: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True " + " ".join(SD),
    ]
    unknown = diagnose_scan("u.log", scan_log(io.BytesIO(b"Traceback (most recent call last):\nValueError: x\n")))
    assert (unknown.fault, unknown.evidence, unknown.line) == ("unknown", "ValueError: x", 2)
    assert format_text(unknown).splitlines()[:3] == [
        "u.log: unknown at line 2", "  evidence: ValueError: x",
        "  why: The run failed, and no rule matched its output."]
    # no exception line of its own (a launcher's report, a traceback cut above it): its last lines
    cut = (b"epoch 3/10\nsaving checkpoint\nTraceback (most recent call last):\n"
           b'  File "train.py", line 9, in <module>\n')
    unknown = diagnose_scan("c.log", scan_log(io.BytesIO(cut)))
    assert unknown.fault == "unknown" and unknown.line == 2 and unknown.evidence is not None
    assert unknown.evidence.split("\n") == ["saving checkpoint", "Traceback (most recent call last):",
                                              '  File "train.py", line 9, in <module>']


MISMATCH = (b"Traceback (most recent call last):\n  File \"train.py\", line 12, in <module>\n"
            b"RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
            b"cuda:0 and cpu!\n")


def test_a_plain_scripts_device_mismatch_names_no_kohya_flag() -> None:
    """A script no adapter knows (its command in the log, or none): the neutral ladder, no flag of any trainer."""
    for log in (MISMATCH, b"$ python train.py --epochs 3\n" + MISMATCH):
        d = diagnose_scan("x.log", scan_log(io.BytesIO(log)))
        assert d.fault == "device_mismatch" and d.remedy and d.remedy[0].startswith("stop: ")
        assert not any("--" in change for change in d.remedy), d.remedy


def test_a_kohya_command_in_the_log_still_gets_kohyas_remedy() -> None:
    log = b"Running command: accelerate launch train_network.py --cache_latents --output_dir o\n" + MISMATCH
    d = diagnose_scan("x.log", scan_log(io.BytesIO(log)))
    assert d.fault == "device_mismatch" and d.remedy == ["remove --cache_latents"]


def test_a_kohya_log_without_its_command_line_gets_kohyas_remedy() -> None:
    """No command line in the log, but kohya's own output (its ``steps:`` bar) or wording (an
    sd-scripts assertion): kohya's ladder, not the neutral one; a plain script's log stays neutral."""
    bar = b"steps:  10%|\xe2\x96\x88         | 2/20 [00:04<00:36,  2.01s/it, avr_loss=0.104]\n"
    d = diagnose_scan("x.log", scan_log(io.BytesIO(bar + MISMATCH)))
    assert d.fault == "device_mismatch" and d.remedy[0].startswith("remove --cache_latents"), d.remedy
    plain = diagnose_scan("x.log", scan_log(io.BytesIO(MISMATCH)))
    assert plain.remedy[0].startswith("stop: ") and plain.remedy != d.remedy
    rules = family_rules() + BUILTIN_RULES
    caching = b"AssertionError: when caching latents, either color_aug or random_crop cannot be used\n"
    by_rule = diagnose_scan("x.log", scan_log(io.BytesIO(caching), rules), rules)
    assert by_rule.fault == "flag_conflict" and by_rule.remedy[0].startswith("remove --cache_latents"), by_rule.remedy
    assert plan_remedy("flag_conflict", None).changes[0].startswith("stop: ")  # the neutral ladder
