"""trainsup@.service under a real systemd (a sandbox booted per test): the unit ``trainsup service
unit`` prints, as installed, over the demo trainer as the project's command.

The test's own drop-in adds only what the sandbox needs, what keeps a test short, and a record:
``DefaultDependencies=no``, output to a file, a 5 s watchdog, 1 s between restarts, no core files,
and an ``ExecStopPost=`` line per end of trainsup (systemd's ``$SERVICE_RESULT $EXIT_CODE
$EXIT_STATUS``), since systemd forgets an inactive instance's properties once it unloads it.
The hardening is the unit's own, so the files live outside /tmp (``PrivateTmp=`` hides it from the
service). Every test boots its own sandbox and powers it off in a ``finally``; never run two at once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Self

import psutil
import yaml

from tests.conftest import ROOT, wait_until
from tests.e2e.demo_harness import FAST_POLICY, assert_same_weights, demo_argv, run_plain, visible_names
from tests.system.sandbox import Sandbox, sandbox
from trainsup.demo.make_assets import make_assets
from trainsup.record.journal import read_events

UNIT = "trainsup@demo.service"
PROPS = ("ActiveState", "SubState", "Result", "StatusText", "MainPID", "NRestarts", "ExecMainCode",
         "ExecMainStatus")
DROP_IN = """\
[Unit]
DefaultDependencies=no

[Service]
StandardOutput=append:{log}
StandardError=inherit
WatchdogSec=5s
RestartSec=1s
TimeoutStartSec=90s
TimeoutStopSec=30s
LimitCORE=0
ExecStopPost=/bin/sh -c 'echo "$$SERVICE_RESULT $$EXIT_CODE $$EXIT_STATUS" >> {ends}'
"""


def _under_tmp(path: Path) -> bool:
    return any(path.absolute().is_relative_to(tmp) for tmp in ("/tmp", "/var/tmp"))


class Service:
    """One project installed as ``trainsup@demo`` in a unit directory, and what it trains."""

    def __init__(self, work: Path, steps: int, env: dict[str, str], policy: str = FAST_POLICY,
                 save_every: int = 4) -> None:
        self.work, self.steps, self.save_every = work, steps, save_every
        self.assets = make_assets(work / "assets")
        self.out = work / "out"
        self.log = work / "service.log"
        self.ends_file = work / "ends"
        projects, self.units = work / "projects", work / "units"
        projects.mkdir()
        project = {"description": "systemd test", "cwd": str(work), "env": env,
                   "command": demo_argv("train_network", self.assets, self.out, steps=steps, save_every=save_every)}
        (projects / "demo.yaml").write_text(yaml.safe_dump(project) + policy)
        unit = subprocess.run([sys.executable, "-m", "trainsup.cli", "service", "unit"], capture_output=True,
                              text=True, env={**os.environ, "TRAINSUP_PROJECTS": str(projects)}, timeout=60,
                              check=True).stdout
        (self.units / "trainsup@.service.d").mkdir(parents=True)
        (self.units / "trainsup@.service").write_text(unit)
        drop_in = DROP_IN.format(log=self.log, ends=self.ends_file)
        if _under_tmp(Path(sys.executable)) or _under_tmp(ROOT):
            # The checkout (and its venv) lives in /tmp, which the unit's PrivateTmp= hides from the
            # service: it could not even start its interpreter. Only then is that one setting lifted.
            drop_in += "PrivateTmp=no\n"
        (self.units / "trainsup@.service.d" / "sandbox.conf").write_text(drop_in)

    def reference(self) -> Path:
        """The same training without trainsup or systemd: the weights a supervised run must end with."""
        ref = self.work / "reference"
        done = run_plain(demo_argv("train_network", self.assets, ref, steps=self.steps, save_every=self.save_every))
        assert done.returncode == 0, done.stderr[-2000:]
        return ref / "lora.safetensors"

    def step(self) -> int:
        """The step `trainsup status` shows."""
        try:
            return int(json.loads((self.out / ".trainsup" / "status.json").read_text()).get("step") or 0)
        except (OSError, ValueError):
            return 0

    def events(self) -> list[dict[str, object]]:
        return read_events(self.out / ".trainsup")

    def saved(self, step: int) -> bool:
        return any(e["event"] == "state_saved" and e["step"] >= step for e in self.events())

    def trainers(self) -> list[int]:
        """The demo trainer processes of this run (the machine sees the sandbox's processes too)."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if cmd[1:3] == ["-m", "trainsup.demo.train_network"] and str(self.out) in cmd:
                found.append(proc.pid)
        return found

    def ends(self) -> list[str]:
        """How each trainsup of the unit ended, as systemd saw it: ``success exited 143``,
        ``signal killed KILL``, ``watchdog dumped ABRT``..."""
        return self.ends_file.read_text().splitlines() if self.ends_file.exists() else []

    def diagnostics(self, sb: Sandbox | None = None) -> str:
        tail = self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(no service log)"
        state = sb.show(UNIT, *PROPS) if sb else {}
        return f"unit: {state}\nends: {self.ends()}\nservice log tail:\n{tail}"


class Census(threading.Thread):
    """Counts the run's trainer processes every few milliseconds: the most seen at one moment."""

    def __init__(self, service: Service) -> None:
        super().__init__(name="trainer-census", daemon=True)
        self.service, self.most, self.halt = service, 0, threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.most = max(self.most, len(self.service.trainers()))
            time.sleep(0.01)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join()


def show(sb: Sandbox) -> dict[str, str]:
    return sb.show(UNIT, *PROPS)


def finished(sb: Sandbox, service: Service, timeout: float = 180) -> dict[str, str]:
    """Wait until the unit is inactive or failed again (trainsup exited for good); its properties."""
    try:
        wait_until(lambda: show(sb)["ActiveState"] in ("inactive", "failed"), timeout=timeout, interval=0.2,
                   what="the service to end")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{service.diagnostics(sb)}") from None
    return show(sb)


def test_started_it_is_active_with_its_step_in_the_status_and_a_stop_is_clean(work: Path) -> None:
    service = Service(work, steps=60, env={"TRAINSUP_DEMO_STEP_SECONDS": "0.3"})
    with sandbox(service.units) as sb:
        sb.ctl("start", UNIT)  # Type=notify: returns once trainsup said READY=1
        state = show(sb)
        assert (state["ActiveState"], state["SubState"]) == ("active", "running"), service.diagnostics(sb)
        main = sb.exec("cat", f"/proc/{state['MainPID']}/cmdline").stdout.split("\0")
        assert main[-4:-1] == ["run", "--project", "demo"], main  # the main process is trainsup itself
        status = wait_until(lambda: re.search(r"\bstep (\d+)/60\b", show(sb)["StatusText"]), timeout=60,
                            interval=0.2, what="a StatusText with the step")
        assert isinstance(status, re.Match)
        assert len(service.trainers()) == 1
        # Later steps reach the status line too (it is throttled, not frozen), and the 5 s watchdog
        # has been fed meanwhile (the unit is still running, never restarted).
        first = int(status.group(1))
        wait_until(lambda: (m := re.search(r"\bstep (\d+)/60\b", show(sb)["StatusText"])) and int(m.group(1)) > first,
                   timeout=30, interval=0.2, what="the step to move on in StatusText")
        time.sleep(6)  # longer than WatchdogSec
        assert show(sb)["NRestarts"] == "0", service.diagnostics(sb)
        sb.ctl("stop", UNIT, timeout=90)
        assert show(sb)["ActiveState"] == "inactive", service.diagnostics(sb)
        # trainsup stopped the trainer and exited 143: a success for the unit, not a failure
        assert service.ends() == ["success exited 143"], service.diagnostics(sb)
        assert service.trainers() == []
        time.sleep(2)  # RestartSec is 1 s: nothing restarts it
        assert show(sb)["ActiveState"] == "inactive" and len(service.ends()) == 1


def signal_main_and_await_restart(sb: Sandbox, signal_flag: str, what: str) -> str:
    """Signal trainsup (the unit's MainPID) and wait for systemd's one restart; the old pid."""
    old = show(sb)["MainPID"]
    sb.exec("kill", signal_flag, old)
    wait_until(lambda: (s := show(sb))["NRestarts"] == "1" and s["MainPID"] not in ("0", old), timeout=60,
               interval=0.1, what=what)
    return old


def test_a_trainsup_killed_mid_epoch_is_restarted_and_ends_as_if_never_interrupted(work: Path) -> None:
    # 4 steps an epoch (8 images, batch 2) and a state every 3 steps: killed at step 10, mid-epoch 3,
    # after the state of step 9. The restarted trainsup resumes from the end of epoch 2 (step 8), the
    # only point the trainer resumes from with the data order an uninterrupted run has there.
    service = Service(work, steps=20, env={"TRAINSUP_DEMO_STEP_SECONDS": "0.3"}, save_every=3)
    reference = service.reference()
    with Census(service) as census, sandbox(service.units) as sb:
        sb.ctl("start", UNIT)
        wait_until(lambda: service.saved(9) and service.step() >= 10, timeout=60, interval=0.05,
                   what="step 10, after the state of step 9")
        killed_at = time.time()
        signal_main_and_await_restart(sb, "-9", "systemd to restart trainsup")
        assert finished(sb, service)["ActiveState"] == "inactive"
        assert service.ends() == ["signal killed KILL", "success exited 0"], service.diagnostics(sb)
    assert census.most == 1, f"{census.most} trainers ran at once"
    starts = [e for e in service.events() if e["event"] == "attempt_start" and float(e["ts"]) > killed_at]
    assert starts, service.diagnostics()
    # systemd ends the trainer a moment after trainsup: it may reach the end of epoch 3 first
    assert starts[0]["resume_step"] in (8, 12), starts[0]
    ends = [e for e in service.events() if e["event"] == "attempt_end"]
    assert starts[-1]["resume_step"] + ends[-1]["steps_trained"] == 20  # exactly the steps asked for
    assert_same_weights(service.out / "lora.safetensors", reference)
    assert visible_names(service.out) == visible_names(reference.parent)


def test_a_frozen_trainsup_is_killed_by_the_watchdog_and_restarted(work: Path) -> None:
    service = Service(work, steps=40, env={"TRAINSUP_DEMO_STEP_SECONDS": "0.3"})
    reference = service.reference()
    with Census(service) as census, sandbox(service.units) as sb:
        sb.ctl("start", UNIT)
        wait_until(lambda: service.saved(4), timeout=60, interval=0.05, what="the state at step 4")
        old = signal_main_and_await_restart(sb, "-STOP", "the watchdog to restart trainsup")
        assert sb.exec("kill", "-0", old).returncode != 0  # the frozen one is gone
        assert finished(sb, service)["ActiveState"] == "inactive"
        ends = service.ends()
        # SIGABRT (WatchdogSignal=) ends it, dumped or killed as the core limit has it
        assert len(ends) == 2 and re.fullmatch(r"watchdog (dumped|killed) ABRT", ends[0]), service.diagnostics(sb)
        assert ends[1] == "success exited 0", service.diagnostics(sb)
    assert census.most == 1, f"{census.most} trainers ran at once"
    assert_same_weights(service.out / "lora.safetensors", reference)


def test_the_hardening_leaves_py_spy_the_stacks_of_a_hung_trainer(work: Path) -> None:
    service = Service(work, steps=20, policy=FAST_POLICY + "hang:\n  min_timeout_s: 5\n",
                      env={"TRAINSUP_DEMO_SIMULATE": "hang@7", "TRAINSUP_DEMO_STEP_SECONDS": "0.1"})
    with sandbox(service.units) as sb:
        sb.ctl("start", UNIT)
        assert finished(sb, service)["ActiveState"] == "inactive"
        assert service.ends() == ["success exited 0"], service.diagnostics(sb)
    faults = [e for e in service.events() if e["event"] == "fault"]
    assert [f["class"] for f in faults] == ["hang"], faults
    stacks = (service.out / ".trainsup" / "hang-1.txt").read_text()
    assert "hang_forever" in stacks, stacks[-2000:]
