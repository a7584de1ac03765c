"""trainsup.service (``trainsup serve``) under a real systemd: the repository's unit file as shipped,
with a test drop-in that points ExecStart= at this checkout's interpreter and the state directory
at the test's files, plus what the sandbox needs (see ``test_systemd_runs``). The queue is fed from
outside the sandbox with ``trainsup queue add``, as a user would from a shell."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from tests.conftest import ROOT, trainsup_cmd, wait_until
from tests.e2e.demo_harness import FAST_POLICY, clean_env, demo_argv
from tests.system.sandbox import sandbox
from tests.system.test_systemd_runs import DROP_IN, _under_tmp
from trainsup.demo.make_assets import make_assets

UNIT = "trainsup.service"
SERVE_DROP_IN = """\
ExecStart=
ExecStart={python} -m trainsup.cli serve
StateDirectory=
Environment=TRAINSUP_STATE={state}
"""


def _queue(state: Path) -> list[dict[str, object]]:
    done = subprocess.run(trainsup_cmd("queue", "list", "--state", str(state), "--json"), capture_output=True,
                          text=True, timeout=60, env=clean_env(), check=True)
    return list(json.loads(done.stdout))


def _add(state: Path, project: Path) -> str:
    done = subprocess.run(trainsup_cmd("queue", "add", "--state", str(state), str(project)), capture_output=True,
                          text=True, timeout=60, env=clean_env(), check=True)
    return done.stdout.strip()


def _ours(work: Path) -> list[int]:
    """Supervisors and trainers of this test (the machine sees the sandbox's processes too)."""
    pids = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if any(str(work) in part for part in cmd) and ("trainsup.demo.train_network" in cmd or "run" in cmd):
            pids.append(proc.pid)
    return pids


def test_the_queue_daemon_starts_says_how_the_queue_stands_and_stops_with_nothing_left(work: Path) -> None:
    assets = make_assets(work / "assets")
    state, units, log, ends = work / "state", work / "units", work / "serve.log", work / "ends"
    projects = work / "projects"
    projects.mkdir()
    for name, steps, env in (("quick", 4, {}), ("slow", 60, {"TRAINSUP_DEMO_STEP_SECONDS": "0.3"})):
        project = {"cwd": str(work), "env": env, "run_dir": str(work / f"run-{name}"),
                   "command": demo_argv("train_network", assets, work / f"out-{name}", steps=steps)}
        (projects / f"{name}.yaml").write_text(yaml.safe_dump(project) + FAST_POLICY)
    units.mkdir()
    (units / UNIT).write_text((ROOT / "systemd" / UNIT).read_text())
    (units / f"{UNIT}.d").mkdir()
    drop_in = DROP_IN.format(log=log, ends=ends) + SERVE_DROP_IN.format(python=sys.executable, state=state)
    if _under_tmp(Path(sys.executable)) or _under_tmp(ROOT):
        drop_in += "PrivateTmp=no\n"
    (units / f"{UNIT}.d" / "sandbox.conf").write_text(drop_in)

    def show() -> dict[str, str]:
        return sb.show(UNIT, "ActiveState", "StatusText", "MainPID", "NRestarts")

    def diagnostics() -> str:
        return f"unit: {show()}\nlog: {log.read_text(errors='replace')[-3000:] if log.exists() else '-'}"

    with sandbox(units) as sb:
        sb.ctl("start", UNIT)  # Type=notify: back once the daemon said READY=1
        assert show()["ActiveState"] == "active", diagnostics()
        main = sb.exec("cat", f"/proc/{show()['MainPID']}/cmdline").stdout.split("\0")
        assert main[-2:-1] == ["serve"], main
        assert _add(state, projects / "quick.yaml") == "q1"
        wait_until(lambda: show()["StatusText"] == "0 running · 0 queued · 1 finished · 0 failed", timeout=120,
                   interval=0.2, what=f"the quick entry finished in StatusText\n{diagnostics()}")
        assert _add(state, projects / "slow.yaml") == "q2"
        wait_until(lambda: re.match(r"1 running · 0 queued · 1 finished", show()["StatusText"]), timeout=60,
                   interval=0.2, what="the slow entry running")
        wait_until(lambda: (work / "run-slow" / "status.json").exists(), timeout=60, what="its supervisor's status")
        time.sleep(6)  # longer than the drop-in's 5 s WatchdogSec: the daemon feeds it
        assert show()["NRestarts"] == "0", diagnostics()
        sb.ctl("stop", UNIT, timeout=150)
        assert show()["ActiveState"] == "inactive", diagnostics()
        assert ends.read_text().split() == ["success", "exited", "0"], diagnostics()
    assert _ours(work) == []  # no supervisor and no trainer left
    entries = {e["id"]: e for e in _queue(state)}
    assert entries["q1"]["state"] == "finished"
    assert entries["q2"]["state"] == "queued"  # interrupted by the stop: it resumes at the next start
    assert "interrupted" in str(entries["q2"]["reason"])
