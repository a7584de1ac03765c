"""Shared test helpers: a wait_until instead of sleeps, and guards against leaked threads/children."""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from trainsup.demo import envs as demo_envs

BedT = TypeVar("BedT")

ROOT = Path(__file__).resolve().parents[1]
CHILDREN = Path(__file__).resolve().parent / "children"

# Every supervisor registers its run dir in the box's index of runs (``record.runindex``): tests keep
# theirs out of the user's (each test gets an index of its own below; this one is for session fixtures).
_SESSION_INDEX = tempfile.mkdtemp(prefix="trainsup-test-runs-")
atexit.register(shutil.rmtree, _SESSION_INDEX, True)
os.environ["TRAINSUP_RUNS"] = _SESSION_INDEX


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.02,
               what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def kept_after_move(path: Path, digest: str, events: list[dict[str, Any]]) -> bool:
    """Whether a file trainsup moved out of the output dir's sight (journal ``state_set_aside`` or
    ``save_hidden``: a save of its own, or an incomplete one it replaced; ``sample_hidden``: a sample
    under an attempt's own name) is whole where it went."""
    path = path.resolve()
    for e in events:
        if e["event"] == "sample_hidden" and Path(e["file"]).resolve() == path:  # published, then moved
            moved = Path(e["to"])
            return moved.is_file() and hashlib.sha256(moved.read_bytes()).hexdigest() == digest
        if e["event"] not in ("state_set_aside", "save_hidden"):
            continue
        src, dst = Path(e["dir"]).resolve(), Path(e["to"])
        if path == src or path.is_relative_to(src):
            moved = dst / path.relative_to(src) if path != src else dst
            return moved.is_file() and hashlib.sha256(moved.read_bytes()).hexdigest() == digest
    return False


def built_bed(setup: Path, where: str, what: str, env: dict[str, str] | None = None) -> Path:
    """Run a real trainer's bed builder (``../shared/real*/setup``) into ``where``: the bed's path, its last
    line of output. A failed build is an error naming the builder, never a skip."""
    done = subprocess.run(["bash", str(setup), where], capture_output=True, text=True, timeout=3600, check=False,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(f"building the {what} bed failed ({setup} {where}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def safetensors_max_abs_diff(a: Path, b: Path) -> float:
    """The largest difference over every tensor of two safetensors files (the same names in both), read
    with safetensors' numpy loader (the test extra's; the supervisor never reads weights)."""
    from safetensors.numpy import load_file

    x, y = load_file(str(a)), load_file(str(b))
    assert sorted(x) == sorted(y), (a, b)
    return max(float(abs(x[k].astype("float64") - y[k].astype("float64")).max()) for k in x)


def ready_bed(found: BedT | str, tier: str) -> BedT:
    """A real tier's bed, or its reason not to run: skipped saying why, except where CI is set, where a
    tier that cannot run fails (a silently skipped tier would be a defect)."""
    if isinstance(found, str):
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and the {tier} tier cannot run: {found}")
        pytest.skip(found)
    return found


def script_process(root_pid: int, script: str) -> psutil.Process | None:
    """The python running ``script`` under ``root_pid`` (a launcher's child, e.g. accelerate's, not the
    launcher itself)."""
    try:
        tree = psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for p in tree:
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if len(argv) > 1 and Path(argv[1]).name == script:
            return p
    return None


def bare_ranks_run(argv: list[str], cwd: Path | None, env: dict[str, str], finished: Callable[[], bool],
                   timeout: float = 600, stuck_grace_s: float = 60) -> tuple[int, str]:
    """A bare run of a real multi-rank trainer (an uninterrupted reference), to its end: its exit code and stderr.

    With gloo a rank may stay in its interpreter's exit for good once the run is done (seen on TRL's two ranks
    under torchrun, a bare run: rank 1 in ``~ProcessGroupGloo`` joining a thread that never ends, py-spy
    ``--native``), and its launcher waits for it forever. Once ``finished()`` holds (the run's last outputs are
    written) and the launcher is still there ``stuck_grace_s`` later, its processes are killed and the run counts
    as done (0, said on stdout): what the test compares are those outputs. trainsup stops such a rank itself
    (``RANKS_EXIT_GRACE_S``); a bare reference has nobody to."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline, done_at, code = time.monotonic() + timeout, None, None
        try:
            while (code := proc.poll()) is None and time.monotonic() < deadline:
                if done_at is None and finished():
                    done_at = time.monotonic()
                if done_at is not None and time.monotonic() - done_at > stuck_grace_s:
                    print(f"the reference's outputs were complete {stuck_grace_s:g} s ago and a rank had not exited: "
                          "its processes are stopped, the run counts as done")
                    code = 0
                    break
                time.sleep(0.25)
        finally:
            if proc.poll() is None:
                tree = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
                for p in tree:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                psutil.wait_procs(tree, timeout=30)
        err.seek(0)
        return (code if code is not None else -1), err.read().decode(errors="replace")


def trainsup_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainsup.cli", *args]


def diagnose_json(log: Path) -> dict[str, Any]:
    """`trainsup diagnose --json` on one saved log, as a user runs it."""
    done = subprocess.run(trainsup_cmd("diagnose", "--json", str(log)), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[0])
    return result


def run_trainsup(args: list[str], cwd: Path, timeout: float = 240, env: dict[str, str] | None = None,
                 ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(trainsup_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)


@pytest.fixture(scope="session")
def old_safetensors_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real venv (seeing this environment's packages, torch and trainsup included, whatever the
    environment is) whose safetensors is 0.4.1: too old for float8.

    Built once per session from the package registry; tests that change it work on a copy.
    """
    venv = tmp_path_factory.mktemp("venv041") / "venv"
    demo_envs.old_safetensors_venv(venv)
    return venv


@pytest.fixture
def old_safetensors_python(old_safetensors_venv: Path, tmp_path: Path) -> str:
    """The python of a private copy of the 0.4.1 venv (``python -m pip`` works from a copy)."""
    import shutil

    copy = tmp_path / "venv041"
    shutil.copytree(old_safetensors_venv, copy, symlinks=True)
    return str(copy / "bin" / "python")


@pytest.fixture(autouse=True)
def runs_index(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The index of runs this test's supervisors register in (``$TRAINSUP_RUNS``), empty at its start."""
    index = tmp_path_factory.mktemp("runs-index")
    monkeypatch.setenv("TRAINSUP_RUNS", str(index))
    return index


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves a thread or a child process behind."""
    threads_before = set(threading.enumerate())
    yield
    me = psutil.Process(os.getpid())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = [p for p in me.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        extra = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        if not kids and not extra:
            return
        time.sleep(0.05)
    for p in kids:
        p.kill()
    assert not kids, f"test leaked child processes: {[p.cmdline() for p in kids]}"
    assert not extra, f"test leaked threads: {[t.name for t in extra]}"
