"""Every way trainsup stops before (or instead of) training: one `trainsup: error:` line naming what
is at fault, a documented exit code, never a traceback of trainsup's own."""

from __future__ import annotations

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
