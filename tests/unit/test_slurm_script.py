"""`trainsup slurm`: the sbatch script's lines, its mark (never over an edited or foreign file), the
error lines and exit codes (issue 23)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainsup import cli
from trainsup.commands import exitcodes
from trainsup.commands.slurm import MARK, ScriptOptions, SlurmError, is_ours, script_text, write_script
from trainsup.run.project import load_project


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "faces.yaml"
    path.write_text("command: [python3, train.py, --output_dir, out]\nrun_dir: out/.trainsup\n", encoding="utf-8")
    return path


def _slurm(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(["slurm", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _sbatch(text: str) -> list[str]:
    return [line[len("#SBATCH "):] for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_the_script_sets_what_a_requeued_job_needs(project: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "job.sbatch"
    code, out, err = _slurm([str(project), "--output-script", str(script), "--lead", "420", "--singleton",
                             "--time=04:00:00", "-p", "gpu", "--gres=gpu:1"], capsys)
    assert (code, err) == (0, "")
    assert f"wrote {script}" in out and "sbatch " in out
    text = script.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash" and lines[1].startswith(MARK)
    run_dir = tmp_path / "out" / ".trainsup"
    assert _sbatch(text) == ["--job-name=faces", f"--output={run_dir}/slurm-%j.out", "--open-mode=append",
                             "--requeue", "--signal=B:USR1@420", "--dependency=singleton",
                             "--time=04:00:00", "-p gpu", "--gres=gpu:1"]
    assert run_dir.is_dir()  # Slurm opens --output before the script runs: its folder must be there
    exec_line = lines[-1]
    assert exec_line.startswith("exec /") and exec_line.endswith(f" run --project {project}")
    trainsup = exec_line.split()[1]
    assert os.access(trainsup, os.X_OK)  # this installation's trainsup, by absolute path
    assert sum(1 for line in lines if line and not line.startswith("#")) == 1  # exec is the whole body
    assert os.stat(script).st_mode & 0o111
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    assert is_ours(text) is True


def test_the_defaults_and_the_users_own_output_and_job_name(project: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, _ = _slurm([str(project)], capsys)
    text = (tmp_path / "faces.sbatch").read_text(encoding="utf-8")  # default: ./NAME.sbatch
    assert code == 0 and "--signal=B:USR1@300" in _sbatch(text) and "--dependency=singleton" not in _sbatch(text)
    code, _, _ = _slurm([str(project), "--output-script", "b.sbatch", "--output=/logs/%x-%j.out", "-J", "f2"], capsys)
    mine = _sbatch((tmp_path / "b.sbatch").read_text(encoding="utf-8"))
    assert code == 0 and mine[:4] == ["--open-mode=append", "--requeue", "--signal=B:USR1@300",
                                      "--output=/logs/%x-%j.out"] and mine[4] == "-J f2"


def test_an_unchanged_script_is_left_and_a_changed_project_rewrites_it(project: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "job.sbatch"
    assert _slurm([str(project), "--output-script", str(script)], capsys)[0] == 0
    code, out, _ = _slurm([str(project), "--output-script", str(script)], capsys)
    assert code == 0 and out.startswith(f"unchanged: {script}")
    code, out, _ = _slurm([str(project), "--output-script", str(script), "--lead", "600"], capsys)
    assert code == 0 and out.startswith("wrote") and "--signal=B:USR1@600" in script.read_text(encoding="utf-8")


@pytest.mark.parametrize("edit", [
    lambda t: t.replace("--time=01:00:00", "--time=02:00:00"),  # an #SBATCH line changed
    lambda t: t + "echo done\n",  # a line added
    lambda t: t.replace("#!/bin/bash", "#!/bin/sh"),  # the shebang changed
])
def test_an_edited_script_is_never_overwritten(project: Path, tmp_path: Path, edit: object,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "job.sbatch"
    assert _slurm([str(project), "--output-script", str(script), "--time=01:00:00"], capsys)[0] == 0
    assert callable(edit)
    edited = edit(script.read_text(encoding="utf-8"))
    script.write_text(edited, encoding="utf-8")
    assert is_ours(edited) is False
    code, out, err = _slurm([str(project), "--output-script", str(script)], capsys)
    assert code == 2 and out == ""
    assert err == (f"trainsup slurm: error: {script} was edited since trainsup slurm wrote it; it is left as it "
                   f"is (submit it with sbatch {script}, or remove it to have it written anew)\n")
    assert script.read_text(encoding="utf-8") == edited


def test_a_foreign_file_is_never_overwritten(project: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --time=1\nsrun python train.py\n", encoding="utf-8")
    code, _, err = _slurm([str(project), "--output-script", str(script)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"trainsup slurm: error: {script} exists and was not written by trainsup slurm")
    assert "srun python" in script.read_text(encoding="utf-8")
    (tmp_path / "dir.sbatch").mkdir()
    code, _, err = _slurm([str(project), "--output-script", str(tmp_path / "dir.sbatch")], capsys)
    assert code == 2 and err.startswith("trainsup slurm: error: ") and "dir.sbatch" in err


@pytest.mark.parametrize(("args", "says"), [
    (["nope"], "no project 'nope'"),
    (["{project}", "--signal=B:USR2@60"], "--signal is not passed through"),
    (["{project}", "--no-requeue"], "--no-requeue is not passed through"),
    (["{project}", "--open-mode", "truncate"], "--open-mode is not passed through"),
    (["{project}", "--singleton", "--dependency=afterok:7"], "--singleton beside --dependency"),
    (["{project}", "--lead", "70000"], "--lead 70000: Slurm takes 1 to 65535 seconds"),
    (["{project}", "--time=5", "stray"], "'stray' is not an sbatch option"),
    (["{project}", "-p", "gpu", "more"], "'more' is not an sbatch option"),
])
def test_bad_input_is_one_error_line_and_exit_2(args: list[str], says: str, project: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TRAINSUP_PROJECTS", str(tmp_path / "projects"))
    monkeypatch.chdir(tmp_path)
    code, out, err = _slurm([a.replace("{project}", str(project)) for a in args], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("trainsup slurm: error: ") and says in err
    assert not (tmp_path / "faces.sbatch").exists()


def test_an_invalid_project_names_its_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: 3\n", encoding="utf-8")
    code, _, err = _slurm([str(bad)], capsys)
    assert code == 2 and err.startswith(f"trainsup slurm: error: {bad}") and err.count("\n") == 1


def test_submit_without_sbatch_or_with_a_failing_one_exits_1(project: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    script = tmp_path / "job.sbatch"
    code, out, err = _slurm([str(project), "--output-script", str(script), "--submit"], capsys)
    assert code == 1 and f"wrote {script}" in out
    assert err == (f"trainsup slurm: error: --submit: sbatch is not on PATH; {script} is written, submit it "
                   "where Slurm's clients are installed\n")
    fake = bin_dir / "sbatch"
    fake.write_text(f"#!{shutil.which('bash', path=os.defpath)}\necho \"sbatch: error: Batch job submission failed: "
                    "Invalid partition name specified\" >&2\nexit 1\n", encoding="utf-8")
    fake.chmod(0o755)
    code, _, err = _slurm([str(project), "--output-script", str(script), "--submit"], capsys)
    assert code == 1
    assert err == f"trainsup slurm: error: --submit: sbatch exited 1 (its message is above); {script} is kept\n"
    fake.write_text(f"#!{shutil.which('bash', path=os.defpath)}\necho \"Submitted batch job 12 $1\"\n",
                    encoding="utf-8")
    code, out, err = _slurm([str(project), "--output-script", str(script), "--submit"], capsys)
    assert (code, err) == (0, "")


def test_write_script_and_the_mark() -> None:
    with pytest.raises(SlurmError):
        write_script(Path("/proc/version"), "#!/bin/bash\n")  # foreign: never replaced
    assert is_ours("#!/bin/bash\necho hi\n") is None
    assert is_ours(f"#!/bin/bash\n{MARK}{'0' * 64}\n") is False


def test_the_comment_names_the_contracts_codes(project: Path) -> None:
    text = script_text(load_project(project), ["/x/trainsup"], Path("/runs"), ScriptOptions())
    assert f"exit {exitcodes.SIGTERM}" in text
    assert ", ".join(map(str, exitcodes.NOT_RETRYABLE)) in text
    assert exitcodes.INTERNAL == cli.EXIT_INTERNAL


def test_other_verbs_still_refuse_unknown_arguments() -> None:
    done = subprocess.run([sys.executable, "-m", "trainsup.cli", "status", "--bogus"], capture_output=True,
                          text=True, check=False)
    # the verb's own usage and name
    assert (done.returncode == 2
            and done.stderr.splitlines()[-1] == "trainsup status: error: unrecognized arguments: --bogus")
