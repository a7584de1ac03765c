"""Planned stops with a trainer's own signal (``TrainerRun.planned_stop_signal``; OneTrainer: SIGINT,
so it backs up first), against small real children: the signal reaches the child, an attempt stopped
for a change uses it, and a child that closes its pipes but never exits (OneTrainer once hung after
``Saving``) is SIGKILLed after the grace."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

from trainsup.faults.rules import BUILTIN_RULES
from trainsup.faults.scanner import FaultScanner
from trainsup.run import process
from trainsup.run.attempt import AttemptSpec, run_attempt
from trainsup.run.events import Event, EventQueue, StopForChange, StopRequested, new_queue

SAVES_ON_SIGINT = """
import os, signal, sys, time
def on_int(*_):  # os.write: the signal may land inside print("ready")'s flush
    open(sys.argv[1], "w").write("backed up")
    os.write(1, b"Creating Backup x\\n")
    os._exit(0)
signal.signal(signal.SIGINT, on_int)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""

HANGS_AFTER_SAVING = """
import os, signal, sys, time
def on_int(*_):
    os.write(1, b"Saving model\\n")
    os.close(1); os.close(2)  # both pipes at EOF, the process still there
    while True:
        time.sleep(1)
signal.signal(signal.SIGINT, on_int)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def child(tmp: Path, script: str, *args: str) -> process.Child:
    path = tmp / "child.py"
    path.write_text(script)
    c = process.spawn([sys.executable, str(path), *args], {}, tmp)
    assert c.popen.stdout is not None
    assert c.popen.stdout.readline().strip() == b"ready"
    return c


def stop_once_ready(log: Path, events: EventQueue, event: Event) -> None:
    """Put ``event`` on the attempt's queue once the child has said ``ready`` (from a thread)."""

    def when_ready() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if log.exists() and b"ready" in log.read_bytes():
                events.put(event)
                return
            time.sleep(0.01)

    threading.Thread(target=when_ready, daemon=True).start()


def test_stop_tree_sends_the_planned_signal(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    c = child(tmp_path, SAVES_ON_SIGINT, str(marker))
    process.stop_tree(c, 10, signal.SIGINT)
    assert c.popen.returncode == 0 and marker.read_text() == "backed up"


def test_a_child_that_hangs_after_closing_its_pipes_is_killed_after_the_grace(tmp_path: Path) -> None:
    c = child(tmp_path, HANGS_AFTER_SAVING)
    started = time.monotonic()
    process.stop_tree(c, 1.0, signal.SIGINT)
    assert c.popen.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 8


def test_an_attempt_stopped_for_a_change_uses_the_planned_signal(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    script = tmp_path / "child.py"
    script.write_text(SAVES_ON_SIGINT)
    events = new_queue()
    log = tmp_path / "attempt.log"

    stop_once_ready(log, events, StopForChange())  # the engine's "stop at this checkpoint"
    started = time.monotonic()
    spec = AttemptSpec(argv=[sys.executable, str(script), str(marker)], env={}, cwd=tmp_path, log_path=log,
                       grace_s=10, pump_wait_s=2, echo=False, planned_signal=signal.SIGINT)
    result = run_attempt(spec, FaultScanner(BUILTIN_RULES), events)
    assert result.stopped_for_change and result.fault is None
    assert marker.read_text() == "backed up" and result.exit_code == 0
    assert time.monotonic() - started < 10


def test_a_stop_request_sends_the_trainer_the_signal_it_names(tmp_path: Path) -> None:
    """The deadline's stop with the trainer's save signal: the run stops for SIGUSR1, the child gets SIGINT."""
    marker = tmp_path / "marker"
    script = tmp_path / "child.py"
    script.write_text(SAVES_ON_SIGINT)
    events = new_queue()
    log = tmp_path / "attempt.log"

    stop_once_ready(log, events, StopRequested(signal.SIGUSR1, signal.SIGINT))
    spec = AttemptSpec(argv=[sys.executable, str(script), str(marker)], env={}, cwd=tmp_path, log_path=log,
                       grace_s=10, pump_wait_s=2, echo=False)
    result = run_attempt(spec, FaultScanner(BUILTIN_RULES), events)
    assert result.stop_signal == signal.SIGUSR1 and result.fault is None
    assert marker.read_text() == "backed up" and result.exit_code == 0
