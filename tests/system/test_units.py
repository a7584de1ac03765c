"""The unit files: one source (``trainsup.commands.service_units``), the repository's ``systemd/``
copies held equal to it, and every unit accepted by this machine's ``systemd-analyze verify`` with no
warning about a setting it does not know."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, trainsup_cmd
from trainsup.commands.service import systemd_version, trainsup_exec
from trainsup.commands.service_units import (
    RESTART_STEPS_SINCE,
    SHIPPED,
    UnitValueError,
    environment_assignment,
    exec_arg,
    parse_systemd_version,
    render,
    shipped_units,
    unit_text,
)

NEWER_KEYS = {"RestartSteps", "RestartMaxDelaySec"}  # known from systemd 254 on
_UNKNOWN = re.compile(r"Unknown (?:key|key name) '?(\w+)'? in section", re.IGNORECASE)


def test_the_repository_copies_are_the_rendered_templates() -> None:
    for rel, text in shipped_units().items():
        path = ROOT / "systemd" / rel
        assert path.is_file(), f"{path} is missing"
        assert path.read_text() == text, (
            f"{path} differs from trainsup.commands.service_units; after editing the template run: python -c "
            "'from pathlib import Path; from trainsup.commands.service_units import write_shipped; "
            "write_shipped(Path(\"systemd\"))'")


def test_service_unit_prints_the_template_with_this_installation() -> None:
    env = {**os.environ, "TRAINSUP_PROJECTS": "/srv/train projects/100%"}
    done = subprocess.run(trainsup_cmd("service", "unit"), capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    # run as `python -m trainsup.cli`: the console script beside this interpreter, else the interpreter
    exe = trainsup_exec(argv0=str(ROOT / "supervisor" / "trainsup" / "cli.py"), executable=sys.executable)
    assert done.stdout == unit_text(user=False, exec_argv=exe, projects=Path("/srv/train projects/100%"),
                                    systemd_version=systemd_version())
    assert 'Environment="TRAINSUP_PROJECTS=/srv/train projects/100%%"' in done.stdout
    user = subprocess.run(trainsup_cmd("service", "unit", "--user"), capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert user.returncode == 0 and "WantedBy=default.target" in user.stdout and "User=" not in \
        "\n".join(line for line in user.stdout.splitlines() if not line.startswith("#"))


def test_trainsup_exec_prefers_the_console_script_and_keeps_the_venv_link(tmp_path: Path) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.symlink_to(sys.executable)
    assert trainsup_exec(argv0="-c", executable=str(python)) == [str(python), "-m", "trainsup.cli"]
    script = bin_dir / "trainsup"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert trainsup_exec(argv0="-c", executable=str(python)) == [str(script)]
    elsewhere = tmp_path / "bin" / "trainsup"
    elsewhere.parent.mkdir()
    shutil.copy2(script, elsewhere)
    assert trainsup_exec(argv0=str(elsewhere), executable=str(python)) == [str(elsewhere)]


def test_values_are_escaped_for_the_unit() -> None:
    assert exec_arg("/opt/venv/bin/trainsup") == "/opt/venv/bin/trainsup"
    assert exec_arg("/opt/my venv/bin/trainsup") == '"/opt/my venv/bin/trainsup"'
    assert exec_arg("/opt/a%b") == "/opt/a%%b"
    assert exec_arg("/opt/a$c") == '"/opt/a$$c"'
    assert exec_arg('/o"q\\') == '"/o\\"q\\\\"'
    assert environment_assignment("X", "/a b") == '"X=/a b"'
    with pytest.raises(UnitValueError):
        exec_arg("/a\nb")


def test_restart_steps_only_for_a_systemd_that_knows_them() -> None:
    new = render(user=False, exec_text="/x", projects_text="P=/p", systemd_version=RESTART_STEPS_SINCE)
    old = render(user=False, exec_text="/x", projects_text="P=/p", systemd_version=252)
    assert "\nRestartSteps=4\nRestartMaxDelaySec=5min\n" in new
    assert "\nRestartSteps" not in old and "need systemd >= 254, this is 252" in old
    assert parse_systemd_version("systemd 252 (252.38-1~deb12u1)\n+PAM +AUDIT") == 252
    assert parse_systemd_version("bash: systemctl: not found") is None


def _verify(unit: str, user: bool, tmp_path: Path) -> str:
    """``systemd-analyze verify`` of the unit as instance ``trainsup@verify``: its output."""
    folder = tmp_path / ("user" if user else "system")
    folder.mkdir()
    path = folder / "trainsup@verify.service"
    path.write_text(unit)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}  # a --user verify needs one, even offline
    done = subprocess.run(["systemd-analyze", *(["--user"] if user else []), "verify", str(path)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, f"systemd-analyze verify failed:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def _unknown_keys(output: str) -> set[str]:
    return set(_UNKNOWN.findall(output))


@pytest.fixture
def analyze() -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")


@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_the_unit_for_this_installation_verifies_without_a_warning(analyze: None, user: bool,
                                                                    tmp_path: Path) -> None:
    unit = unit_text(user=user, exec_argv=trainsup_exec(executable=sys.executable), projects=tmp_path / "projects",
                     systemd_version=systemd_version())
    output = _verify(unit, user, tmp_path)
    assert not _unknown_keys(output), output
    assert output.strip() == "", output  # nothing else to warn about either


@pytest.mark.parametrize("rel", sorted(SHIPPED))
def test_the_shipped_units_know_no_setting_unknown_to_systemd(analyze: None, rel: str, tmp_path: Path) -> None:
    """The repository's copies (for the newest systemd) with ExecStart pointing at a real executable:
    the only keys this systemd may not know are those of later releases."""
    user, _, projects = SHIPPED[rel]
    exe = trainsup_exec(executable=sys.executable)
    unit = render(user=user, exec_text=" ".join(exec_arg(a) for a in exe), projects_text=projects,
                  systemd_version=None)
    unknown = _unknown_keys(_verify(unit, user, tmp_path))
    version = systemd_version()
    allowed = NEWER_KEYS if version is not None and version < RESTART_STEPS_SINCE else set()
    assert unknown <= allowed, f"systemd {version} does not know {sorted(unknown - allowed)}"


def test_the_queue_daemons_unit_knows_no_setting_unknown_to_systemd(analyze: None, tmp_path: Path) -> None:
    """systemd/trainsup.service (``trainsup serve``), its ExecStart= pointed at a real executable."""
    exe = " ".join(exec_arg(a) for a in trainsup_exec(executable=sys.executable))
    text = (ROOT / "systemd" / "trainsup.service").read_text()
    assert "ExecStart=/usr/local/bin/trainsup serve\n" in text
    output = _verify(text.replace("ExecStart=/usr/local/bin/trainsup serve", f"ExecStart={exe} serve"), False,
                     tmp_path)
    assert not _unknown_keys(output), output
