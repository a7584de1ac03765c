"""Owns the child process tree: start it in its own session, and stop all of it.

kohya's trainers and accelerate's single-process launcher ignore SIGTERM/SIGINT handling, and
killing only the launcher orphans the training child that holds the GPU. So the job starts in a new
session (its own process group), and stopping means: SIGTERM to the group, wait against one
deadline, SIGKILL the group and any descendant that left it, reap. No ``preexec_fn``.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
PIPE_SIZE = 1 << 20  # a roomy pipe lets the reader take big chunks and ride out short stalls


@dataclass
class Child:
    popen: subprocess.Popen[bytes]
    started: float

    @property
    def pid(self) -> int:
        return self.popen.pid


def spawn(argv: list[str], env: dict[str, str], cwd: Path | None) -> Child:
    try:
        popen = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
        )
    except FileNotFoundError:
        raise LaunchError(f"cannot start {argv[0]!r}: no such program") from None
    except PermissionError:
        raise LaunchError(f"cannot start {argv[0]!r}: permission denied") from None
    for pipe in (popen.stdout, popen.stderr):
        if pipe is not None:
            try:
                fcntl.fcntl(pipe.fileno(), _F_SETPIPE_SZ, PIPE_SIZE)
            except OSError:
                pass  # the system limit may be lower; the default pipe still works
    return Child(popen, time.monotonic())


class LaunchError(RuntimeError):
    pass


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def stop_tree(child: Child, grace_s: float, sig: int = signal.SIGTERM) -> None:
    """``sig`` (SIGTERM) to the group, wait up to ``grace_s``, SIGKILL what is left (group and strays),
    reap. The wait is for the processes, not their pipes: a trainer may close both and never exit."""
    pgid = child.pid  # start_new_session makes the child its group's leader
    descendants = _tree(child.pid)
    _signal_group(pgid, sig)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if child.popen.poll() is not None and not _alive(descendants) and not _group_alive(pgid):
            break
        time.sleep(0.02)
    descendants += [p for p in _tree(child.pid) if p not in descendants]
    _signal_group(pgid, signal.SIGKILL)
    for proc in descendants:  # a descendant may have left the group with setsid
        try:
            proc.kill()
        except psutil.Error:
            pass
    try:
        child.popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    psutil.wait_procs(descendants, timeout=5)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # The leader may be a zombie we have not reaped yet; only live members count.
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.Error, ProcessLookupError):
            continue
    return False


def _alive(procs: list[psutil.Process]) -> bool:
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def exit_signal(returncode: int | None) -> tuple[int | None, int | None]:
    """Popen's returncode as (exit_code, signal)."""
    if returncode is None:
        return None, None
    if returncode < 0:
        return None, -returncode
    return returncode, None
