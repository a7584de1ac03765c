"""`trainsup doctor` and `trainsup diagnose` on the real command, and a flag SD1 does not have."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import diagnose_json as diagnose
from tests.conftest import trainsup_cmd
from tests.e2e.demo_harness import supervise
from tests.real.bed import Bed
from tests.real.test_real_runs import BNB, POLICY


def doctor(bed: Bed, argv: list[str]) -> tuple[int, dict[str, object]]:
    done = subprocess.run(trainsup_cmd("doctor", "--json", "--", *argv), capture_output=True, text=True,
                          timeout=300, cwd=bed.sd_scripts, env=bed.env(), check=False)
    return done.returncode, json.loads(done.stdout)


def test_doctor_passes_the_working_command_and_finds_its_interpreter(bed: Bed, tmp_path: Path) -> None:
    code, report = doctor(bed, bed.command(tmp_path / "out"))
    assert code == 0, report
    assert report["python"] == str(bed.python)  # found through the venv's accelerate launch script
    versions = report["versions"]
    assert isinstance(versions, dict) and versions["safetensors"] == "0.4.5" and versions["accelerate"] == "1.6.0"


def test_text_encoder_caching_on_sd1_is_a_blocker_and_a_config_error_not_the_warning_before_it(
        bed: Bed, bnb_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = bed.command(out, "--cache_text_encoder_outputs")
    code, report = doctor(bed, argv)
    findings = report["findings"]
    assert code == 2 and isinstance(findings, list)
    assert any(f["id"] == "unknown_flag" and "--cache_text_encoder_outputs" in f["message"] for f in findings)
    # Real sd-scripts: `unrecognized arguments`, exit 2, which accelerate turns into exit 1 and a
    # CalledProcessError traceback. The bitsandbytes warning printed first explains nothing.
    run = supervise(argv, out, tmp_path, env=bnb_env, policy=POLICY, timeout=600, cwd=bed.sd_scripts)
    assert run.returncode == 4, run.stderr[-3000:]
    assert run.of("attempt_end")[0]["child_status"] == 2
    fault = run.of("fault")[0]
    assert (fault["class"] == "config_error"
            and "unrecognized arguments: --cache_text_encoder_outputs" in fault["evidence"])
    log = run.run_dir / "attempt-1.log"
    assert BNB in log.read_text(encoding="utf-8", errors="replace")
    offline = diagnose(log)
    assert offline["fault"] == "config_error" and "unrecognized arguments" in offline["evidence"], offline
    assert len(run.of("attempt_start")) == 1  # stopped at once: a restart cannot fix it
