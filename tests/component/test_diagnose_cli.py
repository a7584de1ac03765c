"""`trainsup diagnose` as users run it: a real subprocess over every fixture log, stdin, errors, commands.

Fixture names say the expected class: ``<id>__variant.log``; ``clean__*`` has no fault; ``unknown__*``
failed visibly with no rule matching, so it is ``unknown`` with no evidence line.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_trainsup, trainsup_cmd
from trainsup.faults.linetext import strip_ansi

LOGS = ROOT / "tests" / "fixtures" / "logs"
FIXTURES = sorted(LOGS.glob("*.log"))
ACCELERATE = "accelerate launch --num_cpu_threads_per_process 1"


def expected(path: Path) -> str | None:
    prefix = path.name.split("__", 1)[0]
    return None if prefix == "clean" else prefix


def fixture(prefix: str) -> Path:
    return next(p for p in FIXTURES if p.name.startswith(prefix + "__"))


def json_lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def test_every_fixture_in_text_form() -> None:
    result = run_trainsup(["diagnose", *(str(p.relative_to(ROOT)) for p in FIXTURES)], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    heads = [line for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    assert len(heads) == len(FIXTURES)
    for path, head in zip(FIXTURES, heads, strict=True):
        name = str(path.relative_to(ROOT))
        want = expected(path)
        if want is None:
            assert head.startswith(f"{name}: no fault: "), head
        else:  # an unknown failure too is shown by its line
            assert head.startswith(f"{name}: {want} at line "), head
    assert result.stdout.count("  trainsup run would: ") == sum(expected(p) is not None for p in FIXTURES)


def test_every_fixture_in_json_form_with_its_evidence_line() -> None:
    result = run_trainsup(["diagnose", "--json", *map(str, FIXTURES)], cwd=ROOT)
    assert result.returncode == 0, result.stderr
    objects = json_lines(result.stdout)
    assert [o["file"] for o in objects] == list(map(str, FIXTURES))
    for path, obj in zip(FIXTURES, objects, strict=True):
        assert obj["fault"] == expected(path), path.name
        if obj["fault"] is None:
            assert obj["evidence"] is None and obj["line"] is None and obj["remedy"] == []
            continue
        if obj["fault"] == "unknown":  # never without its line
            assert obj["remedy"] == ["restart from the last safe state"]
        assert isinstance(obj["line"], int) and isinstance(obj["evidence"], str) and obj["remedy"]
        assert isinstance(obj["explanation"], str) and obj["explanation"].endswith(".")
        editor_line = path.read_bytes().split(b"\n")[obj["line"] - 1].decode("utf-8", "replace")
        assert obj["evidence"].split("\n")[0] in strip_ansi(editor_line), path.name


def test_stdin_is_read_for_a_dash() -> None:
    log = fixture("host_oom_killed").read_bytes()
    proc = subprocess.run(trainsup_cmd("diagnose", "--json", "-"), input=log, capture_output=True, cwd=ROOT,
                          timeout=60, check=False)
    assert proc.returncode == 0
    (obj,) = json_lines(proc.stdout.decode())
    assert (obj["file"], obj["fault"]) == ("-", "host_oom_killed")


def test_unreadable_inputs_exit_2_and_the_others_are_still_classified(tmp_path: Path) -> None:
    good = fixture("cuda_fatal")
    locked = tmp_path / "locked.log"
    locked.write_text("x\n")
    locked.chmod(0)
    args = [str(tmp_path / "missing.log"), str(tmp_path), str(good)]
    if os.geteuid() != 0:  # root reads a mode-000 file anyway
        args.append(str(locked))
    result = run_trainsup(["diagnose", *args], cwd=ROOT)
    assert result.returncode == 2
    errors = result.stderr.splitlines()
    assert errors[0] == f"trainsup diagnose: error: cannot read {tmp_path / 'missing.log'}: No such file or directory"
    assert errors[1] == f"trainsup diagnose: error: cannot read {tmp_path}: Is a directory"
    if os.geteuid() != 0:
        assert errors[2] == f"trainsup diagnose: error: cannot read {locked}: Permission denied"
    assert result.stdout.startswith(f"{good}: cuda_fatal at line ")
    as_json = run_trainsup(["diagnose", "--json", str(tmp_path / "missing.log"), str(good)], cwd=ROOT)
    assert as_json.returncode == 2
    first, second = json_lines(as_json.stdout)
    assert first == {"file": str(tmp_path / "missing.log"), "error": "No such file or directory"}
    assert second["fault"] == "cuda_fatal"


def test_a_given_command_comes_back_corrected() -> None:
    command = f"{ACCELERATE} train_network.py --cache_latents --output_dir o"
    result = run_trainsup(["diagnose", "--json", "--command", command, str(fixture("device_mismatch"))], cwd=ROOT)
    (obj,) = json_lines(result.stdout)
    assert obj["remedy"] == ["remove --cache_latents"]
    assert obj["command"] == f"{ACCELERATE} train_network.py --output_dir o"
    assert obj["command_source"] == "--command"
    flux = f"{ACCELERATE} flux_train_network.py --output_dir o --network_module networks.lora_flux"
    text = run_trainsup(["diagnose", "--command", flux, str(fixture("meta_tensor"))], cwd=ROOT).stdout
    assert f"  corrected command: {flux} --fp8_base --mixed_precision bf16" in text.splitlines()


def test_never_a_flag_the_script_lacks() -> None:
    # meta_tensor's first rung adds --fp8_base; with it already there, the ladder's next rung stops.
    sd = f"{ACCELERATE} train_network.py --output_dir o --fp8_base --mixed_precision bf16"
    (obj,) = json_lines(run_trainsup(["diagnose", "--json", "--command", sd, str(fixture("meta_tensor"))],
                                     cwd=ROOT).stdout)
    remedy = obj["remedy"]
    assert isinstance(remedy, list) and remedy[0].startswith("stop: weights stayed on the meta device")
    assert "command" not in obj
    # device_mismatch's second rung removes text-encoder caching, which SD1's script does not have.
    (obj,) = json_lines(run_trainsup(["diagnose", "--json", "--command", f"{ACCELERATE} train_network.py",
                                      str(fixture("device_mismatch"))], cwd=ROOT).stdout)
    assert obj["remedy"] == ["stop: tensors are still on two devices with latent and text-encoder caching off"]


def test_the_command_line_shown_in_the_log_is_corrected() -> None:
    log = LOGS / "device_mismatch__windows_crlf_gui_executing_command.log"
    (obj,) = json_lines(run_trainsup(["diagnose", "--json", str(log)], cwd=ROOT).stdout)
    assert obj["command_source"] == "log"
    command = str(obj["command"])
    assert command.startswith("D:/kohya_ss/venv/Scripts/accelerate.EXE launch --dynamo_backend no")
    assert "train_network.py --output_dir D:/lora/model" in command and "--cache_latents" not in command


def test_bad_options_exit_2() -> None:
    result = run_trainsup(["diagnose", "--command", "accelerate launch", str(fixture("cuda_oom"))], cwd=ROOT)
    assert result.returncode == 2 and "--command: cannot find the training script" in result.stderr


def test_policy_user_rules_come_first_and_cannot_shadow_builtins(tmp_path: Path) -> None:
    log = tmp_path / "custom.log"
    # The trainer's own exception ended the run; the shell's `Killed` after it is launcher noise.
    log.write_text('epoch 1/1\nTraceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
                   "MyTrainerError: dataset shard 7 is corrupt\nKilled\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - id: shard_corrupt\n    patterns: ['MyTrainerError: dataset shard']\n"
                      "    explanation: A dataset shard is corrupt.\n    restartable: false\n")
    (obj,) = json_lines(run_trainsup(["diagnose", "--json", "--policy", str(policy), str(log)], cwd=ROOT).stdout)
    assert (obj["fault"], obj["line"], obj["explanation"]) == ("shard_corrupt", 4, "A dataset shard is corrupt.")
    (plain,) = json_lines(run_trainsup(["diagnose", "--json", str(log)], cwd=ROOT).stdout)
    assert plain["fault"] == "host_oom_killed"
    policy.write_text("rules:\n  - id: cuda_oom\n    patterns: ['MyTrainerError']\n")
    shadow = run_trainsup(["diagnose", "--policy", str(policy), str(log)], cwd=ROOT)
    assert shadow.returncode == 2 and shadow.stdout == ""
    assert "rules[0].id: 'cuda_oom' is a built-in fault; set extends: true" in shadow.stderr
    assert str(policy) in shadow.stderr


@pytest.mark.parametrize("form", [[], ["--json"]])
def test_clean_logs_are_a_classification(form: list[str]) -> None:
    result = run_trainsup(["diagnose", *form, str(fixture("clean"))], cwd=ROOT)
    assert result.returncode == 0 and result.stderr == ""
