"""The command line's details, as a user meets them: each verb's own usage on its own errors, every
option in the usage, help for every positional argument, a missing project file named as given, the
doctor and the queue on a project file (a missing model refused at `queue add`, with its path),
`diagnose RUN_DIR` (the attempt logs, and what the run applied after each), `demo --keep` into
somebody's directory refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from tests.conftest import run_trainsup
from trainsup.demo.make_assets import make_assets
from trainsup.demo.story import MARKER, keep_dir
from trainsup.record.journal import Journal

DEMO = [sys.executable, "-m", "trainsup.demo.train_network"]


def test_each_verb_says_its_own_usage_on_its_own_errors(tmp_path: Path) -> None:
    for argv, usage in ((["run", "--foo", "--", "true"], "usage: trainsup run "),
                        (["status", "--foo"], "usage: trainsup status "),
                        (["queue", "add", "--foo", "x"], "usage: trainsup queue add "),
                        (["queue", "list", "--foo"], "usage: trainsup queue list ")):
        done = run_trainsup(argv, cwd=tmp_path, timeout=60)
        assert done.returncode == 2, argv
        assert done.stderr.startswith(usage) and "unrecognized arguments: --foo" in done.stderr, done.stderr


def test_the_usage_names_every_option_and_every_positional_has_help(tmp_path: Path) -> None:
    serve = run_trainsup(["serve", "--help"], cwd=tmp_path, timeout=60).stdout
    usage = serve.split("\n\n")[0]
    assert "--min-free-mib MIB" in usage and "--web ADDR" in usage, usage
    for verb in ("status", "logs", "stop"):
        text = run_trainsup([verb, "--help"], cwd=tmp_path, timeout=60).stdout
        positional = text.split("positional arguments:")[1].split("options:")[0]
        assert "a run dir" in positional and "queue entry" in positional, (verb, positional)


def test_a_missing_project_file_is_named_as_given(tmp_path: Path) -> None:
    done = run_trainsup(["run", "--project", "missing.yaml"], cwd=tmp_path, timeout=60,
                        env=_env(tmp_path))
    assert done.returncode == 2
    assert "missing.yaml.yaml" not in done.stderr and str(tmp_path / "missing.yaml") in done.stderr, done.stderr


def _env(tmp_path: Path) -> dict[str, str]:
    import os

    return {**os.environ, "TRAINSUP_PROJECTS": str(tmp_path / "projects"), "TRAINSUP_STATE": str(tmp_path / "state")}


def test_a_project_with_a_missing_model_is_refused_at_queue_add_with_its_path(tmp_path: Path) -> None:
    assets = make_assets(tmp_path / "assets")
    projects = tmp_path / "projects"
    projects.mkdir()
    missing = tmp_path / "gone" / "model.safetensors"
    command = [*DEMO, "--pretrained_model_name_or_path", str(missing), "--train_data_dir", str(assets["dataset"]),
               "--output_dir", str(tmp_path / "out"), "--output_name", "lora", "--max_train_steps", "4"]
    (projects / "night.yaml").write_text(yaml.safe_dump({"command": command}))
    env = _env(tmp_path)

    doctor = run_trainsup(["doctor", "--project", "night"], cwd=tmp_path, timeout=120, env=env)
    assert doctor.returncode == 2 and f"BLOCKER missing_model: --pretrained_model_name_or_path {missing}" \
        in doctor.stdout, doctor.stdout + doctor.stderr
    refused = run_trainsup(["queue", "add", "night"], cwd=tmp_path, timeout=120, env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    [line] = [x for x in refused.stderr.splitlines() if "error:" in x]
    assert line.startswith("trainsup queue: error: night would fail at its start") and str(missing) in line
    listed = run_trainsup(["queue", "list", "--json"], cwd=tmp_path, timeout=60, env=env)
    assert json.loads(listed.stdout or "[]") == []

    forced = run_trainsup(["queue", "add", "--force", "night"], cwd=tmp_path, timeout=120, env=env)
    assert forced.returncode == 0 and forced.stdout.strip() == "q1", forced.stderr
    assert "queued anyway (--force)" in forced.stderr and str(missing) in forced.stderr

    (projects / "night.yaml").write_text(yaml.safe_dump({"command": [
        c if c != str(missing) else str(assets["model"]) for c in command]}))
    fine = run_trainsup(["doctor", "--project", str(projects / "night.yaml"), "--json"], cwd=tmp_path, timeout=120,
                        env=env)
    assert json.loads(fine.stdout)["exit_code"] in (0, 1), fine.stdout


def test_diagnose_a_run_dir_reads_its_attempts_and_says_what_the_run_applied(tmp_path: Path) -> None:
    run_dir = tmp_path / "out" / ".trainsup"
    run_dir.mkdir(parents=True)
    oom = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    for attempt in (1, 2):
        (run_dir / f"attempt-{attempt}.log").write_text(oom)
    journal = Journal(run_dir)
    for attempt, rung, actions in ((1, 0, ["set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]),
                                   (2, 1, ["add --gradient_checkpointing"])):
        journal.event("attempt_start", attempt=attempt)
        journal.event("attempt_end", attempt=attempt, exit_code=1)
        journal.event("fault", **{"class": "cuda_oom"}, attempt=attempt, evidence="torch.OutOfMemoryError")
        journal.event("remedy", **{"class": "cuda_oom"}, rung=rung, actions=actions)
    journal.close()
    for given in (run_dir, tmp_path / "out"):  # the run dir, or the output dir holding it
        done = run_trainsup(["diagnose", str(given)], cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        blocks = done.stdout.strip().split("\n\n")
        assert [b.split(":")[0] for b in blocks] == [str(run_dir / "attempt-1.log"), str(run_dir / "attempt-2.log")]
        assert "the run applied: add --gradient_checkpointing (remedy 2 for cuda_oom), then attempt 3" in blocks[1]
        assert "would" not in blocks[1]
    as_json = run_trainsup(["diagnose", "--json", str(run_dir)], cwd=tmp_path, timeout=120)
    applied = [json.loads(x)["applied"] for x in as_json.stdout.splitlines()]
    assert applied[0].startswith("set PYTORCH_CUDA_ALLOC_CONF") and "remedy 1 for cuda_oom" in applied[0]


def test_demo_keep_refuses_somebodys_directory_and_takes_an_earlier_demos(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    done = run_trainsup(["demo", "--keep", str(mine)], cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "not empty and holds no earlier demo" in done.stderr and str(mine) in done.stderr
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]

    earlier = tmp_path / "earlier"
    (earlier / "run1" / ".trainsup").mkdir(parents=True)
    (earlier / "policy1.yaml").write_text("x")
    (earlier / "venv-safetensors-0.4.1").mkdir()
    (earlier / MARKER).write_text("")
    assert keep_dir(earlier) is None
    assert sorted(p.name for p in earlier.iterdir()) == [MARKER, "venv-safetensors-0.4.1"]  # its runs replaced
    assert keep_dir(tmp_path / "new") is None and (tmp_path / "new" / MARKER).is_file()
