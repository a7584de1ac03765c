"""Owns an entry's supervisor process: starting it, finding it again, and reading how its run ended.

Each entry runs as its own ``trainsup run --project COPY --quiet`` in its own session, so one run's
crash cannot take another down, the daemon never imports torch, and a ``kill -9`` of the daemon
leaves the runs going. Its output goes to the entry's ``serve.log``, never to a pipe of the daemon's
(a pipe would kill it with the daemon). A daemon that starts again finds a live supervisor by the
entry's recorded pid and that process's start time, else by the run dir's lock, else by a process
whose command line names the entry's project copy: whichever way, it adopts that supervisor instead
of starting a second one. How a run ended comes from the exit code when the supervisor was our child,
and from the run dir's journal when it was not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..record.journalkinds import FAULT, FINISHED, GAVE_UP, RUN_START
from ..record.runlock import holder
from ..run.policy import EXIT_CODES_ENV
from ..run.runstate import STOPPED_EXITS
from .queuestore import Entry

SYSTEMD_ONLY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")  # the daemon's, not its runs'
CREATE_SLACK_S = 2.0  # create_time and time.time() round differently
EXIT_STOP_SIGNALS = STOPPED_EXITS  # trainsup run stopped by SIGINT / SIGTERM / the deadline signal


@dataclass(frozen=True)
class Ending:
    state: str  # finished | failed | stopped
    exit_code: int | None
    reason: str | None


def supervisor_argv(entry: Entry) -> list[str]:
    return [sys.executable, "-m", "trainsup.cli", "run", "--project", entry.file, "--quiet"]


def entry_env(gpus: list[str] | None, env: Mapping[str, str]) -> dict[str, str]:
    """The environment of an entry's supervisor: the daemon's, less systemd's, with its GPUs; and its
    exit codes trainsup's own, whatever the project's ``exit_codes:`` (``state_for`` reads them)."""
    child_env = {k: v for k, v in env.items() if k not in SYSTEMD_ONLY_ENV}
    child_env[EXIT_CODES_ENV] = "native"
    if gpus is not None:
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return child_env


def launch(entry: Entry, gpus: list[str] | None, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    child_env = entry_env(gpus, env)
    with open(entry.log, "ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"--- trainsup serve: {entry.id} launch {entry.launches + 1} at {stamp}"
                  f"{' on GPUs ' + ','.join(gpus) if gpus else ''} ---\n".encode())
        log.flush()
        return subprocess.Popen(supervisor_argv(entry), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=child_env, cwd=entry.dir, start_new_session=True)


def create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _names_entry(proc: psutil.Process, entry: Entry) -> bool:
    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return False
    return entry.file in cmdline and "run" in cmdline


def live_supervisor(entry: Entry) -> psutil.Process | None:
    """The process supervising ``entry`` now, whoever started it, or ``None``."""
    if entry.pid is not None:
        try:
            proc = psutil.Process(entry.pid)
            same = entry.pid_started is None or abs(proc.create_time() - entry.pid_started) <= CREATE_SLACK_S
            if same and _alive(proc) and _names_entry(proc, entry):
                return proc
        except psutil.Error:
            pass
    sup = holder(Path(entry.run_dir))
    if sup is not None and sup.pid > 0:
        try:
            proc = psutil.Process(sup.pid)
            if _alive(proc) and _names_entry(proc, entry):
                return proc
        except psutil.Error:
            pass
    for proc in psutil.process_iter():
        if proc.pid != os.getpid() and _names_entry(proc, entry) and _alive(proc):
            return proc
    return None


def state_for(exit_code: int | None, stop_requested: bool) -> str:
    if exit_code == 0:
        return "finished"
    if stop_requested or exit_code in EXIT_STOP_SIGNALS:
        return "stopped"
    return "failed"


def journal_ending(entry: Entry) -> Ending | None:
    """How the entry's newest run ended, from its journal; ``None`` when it has not ended there."""
    path = Path(entry.run_dir) / "events.jsonl"
    since = (entry.started or 0.0) - CREATE_SLACK_S
    ending: Ending | None = None
    evidence: str | None = None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or float(event.get("ts", 0)) < since:
            continue
        kind = event.get("event")
        if kind == RUN_START:
            ending, evidence = None, None  # a later supervisor of the same run: only its end counts
        elif kind == FAULT and event.get("evidence"):
            evidence = " ".join(str(event["evidence"]).split())[:300]
        elif kind == FINISHED:
            ending = Ending("finished", 0, event.get("reason"))
        elif kind == GAVE_UP:
            code = event.get("exit_code")
            reason = event.get("reason")
            state = state_for(code, entry.stop_requested)
            if evidence and reason and state == "failed":  # the trainer's own words say which file or flag
                reason = f"{reason} ({evidence})"  # (a stop's reason is the stop: an earlier fault is not it)
            ending = Ending(state, code, reason)
    return ending


def log_reason(entry: Entry) -> str | None:
    """The last error line the entry's supervisor printed (a run that stopped before its journal began)."""
    try:
        with open(entry.log, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 16384))
            tail = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        if "error:" in line and line.startswith("trainsup"):
            return line.split("error:", 1)[1].strip()[:500]
    return None
