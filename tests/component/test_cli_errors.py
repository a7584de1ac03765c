"""Every way trainsup stops before (or instead of) training: one `trainsup: error:` line naming what
is at fault, a documented exit code, never a traceback of trainsup's own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_trainsup

DEMO = [sys.executable, "-m", "trainsup.demo.train_network"]


def _one_error_line(stderr: str, *naming: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("trainsup") and ": error: " in line]
    assert len(errors) == 1, stderr
    for word in naming:
        assert word in errors[0], errors[0]
    return errors[0]


def test_a_demo_directory_that_is_a_file_is_named(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("mine")
    done = run_trainsup(["demo", "--keep", str(taken)], cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    _one_error_line(done.stderr, str(taken))
    assert taken.read_text() == "mine"


@pytest.mark.parametrize(("content", "naming"), [
    (b"[general\n", "invalid TOML"),
    ('caption = "caf\xe9"\n'.encode("latin-1"), "UTF-8"),
])
def test_a_config_file_trainsup_cannot_read_is_a_usage_error_naming_it(tmp_path: Path, content: bytes,
                                                                        naming: str) -> None:
    config = tmp_path / "cfg.toml"
    config.write_bytes(content)
    done = run_trainsup(["run", "--", *DEMO, "--output_dir", str(tmp_path / "out"), "--config_file", str(config)],
                        cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    _one_error_line(done.stderr, str(config), naming)
    assert config.read_bytes() == content


def _project_bytes(tmp_path: Path, encoding: str, extra: str = "") -> bytes:
    command = [sys.executable, "-c", "print('trained')"]
    text = (f"command: {json.dumps(command)}\ntrainer: command\nrun_dir: {tmp_path / 'run'}\nrestart:\n  max: 0\n"
            f"description: café au lait{extra}\n")
    return text.encode(encoding)


@pytest.mark.parametrize("verb", ["run --project", "run --policy", "queue add"])
@pytest.mark.parametrize(("content", "naming"), [
    ("latin-1", ("not UTF-8 text (byte 0xe9 at line 6, column ", "); save it as UTF-8")),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ("a binary file, not a text ",)),
], ids=["latin-1", "binary"])
def test_a_project_or_policy_file_that_is_not_utf8_is_one_error_line_never_a_traceback(
        tmp_path: Path, verb: str, content: str | bytes, naming: tuple[str, ...]) -> None:
    path = tmp_path / "lora.yaml"
    path.write_bytes(_project_bytes(tmp_path, content) if isinstance(content, str) else content)
    if verb == "run --policy":
        path.write_bytes(path.read_bytes().replace(b"command:", b"# command:").replace(b"trainer:", b"# trainer:")
                         .replace(b"run_dir:", b"# run_dir:").replace(b"description:", b"# description:"))
    args = {"run --project": ["run", "--project", str(path)],
            "run --policy": ["run", "--policy", str(path), "--", *DEMO, "--output_dir", str(tmp_path / "out")],
            "queue add": ["queue", "add", "--state", str(tmp_path / "state"), str(path)]}[verb]
    done = run_trainsup(args, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    _one_error_line(done.stderr, str(path), *naming)


def test_a_notepad_utf16_project_runs_and_is_queued(tmp_path: Path) -> None:
    path = tmp_path / "notepad.yaml"
    path.write_bytes(_project_bytes(tmp_path, "utf-16"))  # Windows Notepad's "Unicode", with its byte-order mark
    done = run_trainsup(["run", "--project", str(path)], cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "trained" in done.stdout
    added = run_trainsup(["queue", "add", "--state", str(tmp_path / "state"), str(path)], cwd=tmp_path, timeout=60)
    assert (added.returncode, added.stdout.strip()) == (0, "q1"), added.stderr
    assert "description: café au lait" in (tmp_path / "state" / "queue" / "q1" / "notepad.yaml").read_text("utf-8")


def test_queue_add_refuses_a_queued_project_and_never_reuses_an_id(tmp_path: Path) -> None:
    state = ["--state", str(tmp_path / "state")]
    paths = []
    for n in range(4):
        (tmp_path / f"p{n}").mkdir()
        paths.append(tmp_path / f"p{n}" / f"lora{n}.yaml")
        paths[-1].write_bytes(_project_bytes(tmp_path / f"p{n}", "utf-8"))
    ids = [run_trainsup(["queue", "add", *state, str(p)], cwd=tmp_path, timeout=60).stdout.strip()
           for p in paths[:3]]
    assert ids == ["q1", "q2", "q3"]
    again = run_trainsup(["queue", "add", *state, str(paths[0])], cwd=tmp_path, timeout=60)
    assert again.returncode == 2
    _one_error_line(again.stderr, str(paths[0]), "already in the queue as q1 (queued", "trainsup queue remove q1")
    for entry_id in ("q1", "q2", "q3"):
        assert run_trainsup(["queue", "remove", *state, entry_id], cwd=tmp_path, timeout=60).returncode == 0
    added = run_trainsup(["queue", "add", *state, str(paths[3])], cwd=tmp_path, timeout=60)
    assert (added.returncode, added.stdout.strip()) == (0, "q4"), added.stderr


def test_a_run_dir_that_cannot_be_made_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    done = run_trainsup(["run", "--run-dir", str(blocker / "sub"), "--", *DEMO, "--output_dir", str(tmp_path)],
                        cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    _one_error_line(done.stderr, str(blocker / "sub"))


def test_a_command_without_a_training_script_is_a_usage_error(tmp_path: Path) -> None:
    done = run_trainsup(["run", "--", "accelerate", "launch"], cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    _one_error_line(done.stderr, "training script")


def test_an_internal_error_is_one_line_and_exit_70(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # The last line of defence, driven through the real entry point: a bug deep inside a verb.
    from trainsup import cli
    from trainsup.commands import doctor

    def broken(*args: object, **kw: object) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(doctor, "run_doctor", broken)
    monkeypatch.delenv("TRAINSUP_DEBUG", raising=False)
    assert cli.main(["doctor", "--", *DEMO]) == cli.EXIT_INTERNAL == 70
    _one_error_line(capsys.readouterr().err, "internal error", "KeyError")
