"""Project files (parsing, errors with file:line, lookup by name) and the sd_notify protocol over a
real AF_UNIX datagram socket, as systemd listens on it."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainsup.run.policy import Policy
from trainsup.run.project import ProjectError, find_project, load_project, parse_project, projects_dir
from trainsup.run.sdnotify import Notifier, status_line


def test_a_project_file_says_what_to_run_and_how(tmp_path: Path) -> None:
    path = tmp_path / "mylora.yaml"
    path.write_text("description: faces v3\n"
                    "command: accelerate launch train_network.py --config_file 'my cfg.toml'\n"
                    "cwd: sd-scripts\n"
                    "env: {HF_HUB_OFFLINE: 1}\n"
                    "gpus: [1, GPU-8c1e]\n"
                    "run_dir: runs/mylora\n"
                    "restart:\n  max: 7\n")
    p = load_project(path)
    assert p.name == "mylora" and p.description == "faces v3"
    assert p.command == ("accelerate", "launch", "train_network.py", "--config_file", "my cfg.toml")
    assert p.cwd == tmp_path / "sd-scripts" and p.run_dir == tmp_path / "sd-scripts" / "runs" / "mylora"
    assert p.env == {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "1,GPU-8c1e"}
    assert p.policy.restart_max == 7 and p.policy.hang == Policy().hang
    assert p.child_env({"PATH": "/bin", "HF_HUB_OFFLINE": "0"})["HF_HUB_OFFLINE"] == "1"  # the project wins
    listed = parse_project("command: [python, -m, x, --steps, 5]\n", path)
    assert listed.command == ("python", "-m", "x", "--steps", "5") and listed.cwd == tmp_path


@pytest.mark.parametrize(("text", "message"), [
    ("restart:\n  max: 3\n", r"p\.yaml:1: command: missing"),
    ("command: []\n", r"p\.yaml:1: command: expected a non-empty command, got \[\]"),
    ("command: x\nenv:\n  A: [1]\n", r"p\.yaml:2: env: expected a string or number for A, got \{'A': \[1\]\}"),
    ("command: x\n\ngpus: true\n", r"p\.yaml:3: gpus: expected a GPU index or UUID, or a list of them, got True"),
    ("command: x\nrestrat:\n  max: 1\n", r"p\.yaml:2: unknown section 'restrat'; expected one of .*command"),
    ("command: \"unclosed\n", r"p\.yaml:2: malformed YAML"),
    ("command: 'a \"b'\n", r"p\.yaml:1: command: expected a command the shell could split"),
])
def test_a_bad_project_file_is_one_error_naming_file_and_line(text: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ProjectError, match=message):
        parse_project(text, tmp_path / "p.yaml")


def test_projects_are_found_by_name_in_the_projects_directory(tmp_path: Path) -> None:
    env = {"TRAINSUP_PROJECTS": str(tmp_path / "projects")}
    (tmp_path / "projects").mkdir()
    (tmp_path / "projects" / "faces.yml").write_text("command: x\n")
    assert find_project("faces", env) == tmp_path / "projects" / "faces.yml"
    assert find_project(str(tmp_path / "projects" / "faces.yml"), env) == tmp_path / "projects" / "faces.yml"
    with pytest.raises(ProjectError, match=r"no project 'hands': neither a file nor .*projects/hands\.yaml"):
        find_project("hands", env)
    assert projects_dir(env) == tmp_path / "projects"
    if os.geteuid() == 0:
        assert projects_dir({}) == Path("/etc/trainsup/projects")
    else:
        assert projects_dir({"XDG_CONFIG_HOME": "/x"}) == Path("/x/trainsup/projects")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["path", "abstract"])
def listener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket where systemd would listen; yields it and the NOTIFY_SOCKET value naming it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        address = str(tmp_path / "notify")
        sock.bind(address)
        name = address
    else:
        name = f"@trainsup-test-{os.getpid()}-{id(sock)}"
        sock.bind("\0" + name[1:])
    sock.settimeout(0.5)
    yield sock, name
    sock.close()


def _received(sock: socket.socket) -> list[str]:
    got = []
    try:
        while True:
            got.append(sock.recv(4096).decode())
    except (TimeoutError, BlockingIOError):
        return got


def test_sd_notify_ready_status_watchdog_and_stopping(listener: tuple[socket.socket, str]) -> None:
    sock, name = listener
    clock = Clock()
    n = Notifier({"NOTIFY_SOCKET": name, "WATCHDOG_USEC": "10000000"}, clock)
    assert n.on and n.watchdog_s == 10.0
    n.ready()
    n.ready()  # once only
    n.status("attempt 1 · step 3/10")  # the first status goes at once, with the first watchdog ping
    assert _received(sock) == [f"READY=1\nMAINPID={os.getpid()}", "WATCHDOG=1", "STATUS=attempt 1 · step 3/10"]
    clock.now += 1
    n.status("attempt 1 · step 4/10")
    n.tick()
    sock.settimeout(0.05)
    assert _received(sock) == []  # within the 2 s throttle and the 5 s ping interval: nothing
    clock.now += 1.5
    n.tick()
    assert _received(sock) == ["STATUS=attempt 1 · step 4/10"]
    clock.now += 3
    n.tick()
    n.tick()
    assert _received(sock) == ["WATCHDOG=1"]  # half of WatchdogSec, once
    n.stopping("finished: training finished")
    assert _received(sock) == ["STOPPING=1\nSTATUS=finished: training finished"]


def test_outside_systemd_nothing_is_sent_and_another_pids_watchdog_is_not_ours(tmp_path: Path) -> None:
    quiet = Notifier({}, Clock())
    assert not quiet.on and quiet.send("READY=1") is False
    quiet.ready()
    quiet.tick()
    other = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone"), "WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "1"},
                     Clock())
    assert other.watchdog_s is None
    assert other.send("READY=1") is False  # nobody listens there: dropped, never raised


def test_the_status_line_tells_the_story() -> None:
    line = status_line({"state": "running", "attempt": 2, "step": 812, "total": 2000, "loss": 0.0831,
                        "rate": 1.9, "last_fault": "cuda_oom"})
    assert line == "running · attempt 2 · step 812/2000 · loss 0.0831 · 1.9 it/s · eta 10m25s · last fault cuda_oom"
    assert status_line({"state": "backoff", "attempt": 3, "loss": float("nan")}) == "backoff · attempt 3 · loss nan"
