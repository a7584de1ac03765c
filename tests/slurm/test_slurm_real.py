"""A real trainer inside real Slurm jobs (issue 23): LitGPT's ``finetune_full`` on the real-LitGPT bed
(``tests/real_litgpt``), as a project whose script ``trainsup slurm`` writes, in the module's sandbox
cluster. Of the real trainers it is the shortest on the CPU (a bare 20-step run of the bed's command:
about 7 s here, sd-scripts' about 250 s) and its resume is bit-exact (from the explicit ``step-N/``).

One bare uninterrupted run of the same command is the reference for both tests, compared with the
bed's own ``max_abs_diff`` and the LitGPT tier's tolerance. Skipped, with the reason, when the sandbox
cannot start (``slurm``) or the bed is not switched on (``TRAINSUP_REALLITGPT=1``, as ``.ci/run`` sets).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import wait_until
from tests.real_litgpt.bed import OFFLINE, LitBed, build_bed
from tests.real_litgpt.test_real_litgpt import EXACT
from tests.slurm.test_slurm_jobs import POLICY, ended, of, usr1, wait_for

TRAINSUP = Path(sys.executable).parent / "trainsup"
METHOD = "finetune_full"
# 40 steps, not the bed's 20: LitGPT saves about every second here, and on loaded CI cores the deadline
# signal must still land before the run's last periodic save (a later flag wins in jsonargparse)
STEPS = ("--train.max_steps", "40")


@pytest.fixture(scope="module")
def litgpt_bed() -> LitBed:
    found = build_bed()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def reference(litgpt_bed: LitBed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``final/lit_model.pth`` of the bed's command run bare, uninterrupted, outside Slurm."""
    out = tmp_path_factory.mktemp("reference") / "out"
    done = litgpt_bed.run_plain(litgpt_bed.command(METHOD, out, *STEPS))
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "final" / "lit_model.pth"


def job_env(bed: LitBed, slurm: dict[str, str]) -> dict[str, str]:
    """What the job inherits from ``sbatch`` (its default ``--export=ALL``): the bed's environment."""
    return {**bed.env(), "SLURM_CONF": slurm["SLURM_CONF"]}


def write_script(bed: LitBed, slurm: dict[str, str], tmp: Path, out: Path, *submit: str) -> tuple[Path, str]:
    """A project running the bed's command (offline; the Slurm tier's short stop and backoff) and the
    script ``trainsup slurm`` writes for it; with ``--submit``, also the id of the job it submitted."""
    project = tmp / "litgpt.yaml"
    project.write_text(yaml.safe_dump({"command": bed.command(METHOD, out, *STEPS), "env": OFFLINE}) + POLICY,
                       encoding="utf-8")
    script = tmp / "litgpt.sbatch"
    done = subprocess.run([str(TRAINSUP), "slurm", str(project), "--output-script", str(script), *submit],
                          env=job_env(bed, slurm), cwd=tmp, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    found = re.search(r"Submitted batch job (\d+)", done.stdout)
    return script, found.group(1) if found else ""


def test_a_clean_litgpt_job_completes_with_exit_0_and_the_uninterrupted_weights(
        litgpt_bed: LitBed, slurm: dict[str, str], reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _, jid = write_script(litgpt_bed, slurm, tmp_path, out, "--submit")
    assert jid, "trainsup slurm --submit printed no job id"
    j = ended(slurm, jid)
    log = out / ".trainsup" / f"slurm-{jid}.out"  # where trainsup slurm points --output
    assert (j["JobState"], j["ExitCode"], j["Restarts"]) == ("COMPLETED", "0:0", "0"), log.read_text()[-3000:]
    assert not of(out, "fault") and len(of(out, "attempt_start")) == 1
    assert of(out, "finished")[0]["final_weights"] == str(out / "final")
    assert litgpt_bed.max_abs_diff(out / "final" / "lit_model.pth", reference) <= EXACT


def test_a_deadline_signal_requeues_the_litgpt_job_which_resumes_to_the_uninterrupted_weights(
        litgpt_bed: LitBed, slurm: dict[str, str], reference: Path, tmp_path: Path) -> None:
    """The script ``trainsup slurm`` writes, edited as a user may (a line that prints
    ``SLURM_RESTART_COUNT`` before the ``exec``), submitted with sbatch. ``scancel -b -s USR1`` as soon
    as the state of step 5 is complete: trainsup has measured one save interval (the launch to step
    5, about 10 s) against a 300 s lead, so it waits for the next save, stops LitGPT right after it
    and requeues the job; the second run resumes from that ``step-N/`` by its explicit path. LitGPT
    saves about every second here, so the test watches the journal every 20 ms: a signal that comes
    after the state of step 10 stops the run after a later state instead (any before the last)."""
    out = tmp_path / "out"
    script, _ = write_script(litgpt_bed, slurm, tmp_path, out)
    text = script.read_text(encoding="utf-8")
    assert text.count("\nexec ") == 1, text
    echo = 'echo "slurm_restart_count=${SLURM_RESTART_COUNT:-unset}"'
    script.write_text(text.replace("\nexec ", f"\n{echo}\nexec "), encoding="utf-8")
    done = subprocess.run(["sbatch", "--parsable", str(script)], env=job_env(litgpt_bed, slurm), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30, check=True)
    jid = done.stdout.strip().split(";")[0]
    wait_until(lambda: any(e["step"] == 5 for e in of(out, "state_saved")), timeout=180, interval=0.02,
               what="the state of step 5")
    usr1(slurm, jid)
    wait_for("the requeue", lambda: of(out, "requeued"), 120)
    deadline = of(out, "deadline")[0]
    assert deadline["signal"] == "SIGUSR1" and deadline["choice"] == "wait_for_save", deadline
    requeued = of(out, "requeued")[0]
    stopped_at = requeued["state_step"]
    assert (requeued["job_id"], requeued["restart_count"]) == (jid, None) and stopped_at in range(10, 40, 5), requeued
    j = ended(slurm, jid)
    log = (out / ".trainsup" / f"slurm-{jid}.out").read_text(encoding="utf-8", errors="replace")
    assert (j["JobState"], j["ExitCode"], j["Restarts"]) == ("COMPLETED", "0:0", "1"), log[-3000:]
    # The log was appended: the first run's lines, Slurm's requeue line, the second run's.
    assert log.index("slurm_restart_count=unset") < log.index("DUE TO JOB REQUEUE") \
        < log.index("slurm_restart_count=1"), log[-3000:]
    assert [e["exit_code"] for e in of(out, "gave_up") if "deadline" in e["reason"]] == [138]
    start = of(out, "attempt_start")[-1]
    state = out / f"step-{stopped_at:06d}"
    assert (start["resume_from"], start["resume_step"]) == (str(state), stopped_at), start
    assert start["argv"][start["argv"].index("--resume") + 1] == str(state / "lit_model.pth")
    attempt_log = out / ".trainsup" / f"attempt-{start['attempt']}.log"
    resumed = attempt_log.read_text(encoding="utf-8", errors="replace")
    assert f"Resuming training from {state / 'lit_model.pth'}" in resumed, resumed[-3000:]
    assert f"iter {stopped_at + 1} step {stopped_at + 1} " in resumed, resumed[-3000:]
    assert of(out, "finished")[0]["final_weights"] == str(out / "final")
    assert litgpt_bed.max_abs_diff(out / "final" / "lit_model.pth", reference) <= EXACT
