"""py-spy stacks of real processes: a running one and a frozen (SIGSTOPped) one, and its launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_until
from trainsup.sensors import stacks

CHILD = """
import subprocess, sys, time
def wait_for_the_trainer():
    subprocess.run([sys.executable, "-c", "import time\\ndef deadlocked_in_a_collective():\\n    time.sleep(600)\\n"
                    "deadlocked_in_a_collective()"])
wait_for_the_trainer()
"""


@pytest.mark.parametrize("frozen", [False, True])
def test_every_python_process_of_the_tree_is_dumped(tmp_path: Path, frozen: bool) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", CHILD])
    try:
        wait_until(lambda: len(stacks.python_tree(launcher.pid)) == 2, what="the launcher and its trainer")
        trainer = stacks.python_tree(launcher.pid)[1]
        # the trainer is in its blocking call once py-spy sees it there (not still starting up)
        wait_until(lambda: "deadlocked_in_a_collective" in (stacks.capture(trainer.pid)[0].innermost or ""),
                   what="the trainer blocked")
        if frozen:
            os.kill(trainer.pid, signal.SIGSTOP)
        taken = stacks.capture(launcher.pid)
        assert [s.innermost.split(" (")[0] if s.innermost else None for s in taken] == [
            "Popen._try_wait", "deadlocked_in_a_collective"]
        report = tmp_path / "hang-1.txt"
        stacks.write_report(taken, report, "no progress for 301 s")
        text = report.read_text()
        assert text.startswith("no progress for 301 s") and f"=== pid {trainer.pid}:" in text
    finally:
        for proc in stacks.python_tree(launcher.pid)[::-1]:
            proc.kill()
        launcher.wait()
