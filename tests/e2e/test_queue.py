"""``trainsup serve`` end to end: a real daemon process, real ``trainsup run --project`` supervisors,
the demo trainer (torch on CPU), and the queue's command line, as a user drives them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import trainsup_cmd, wait_until
from tests.e2e.demo_harness import clean_env, demo_argv
from tests.fakenvml import GIB, FakeNvml
from tests.unit.test_alerts_metrics import Receiver, free_port, scrape
from trainsup.record.journal import read_events
from trainsup.sensors import gpu
from trainsup.service.daemon import Daemon, ServeOptions


def _project(folder: Path, name: str, assets: dict[str, Path], *, steps: int = 8, model: str = "model",
             env: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    argv = demo_argv("train_network", assets, folder / f"out-{name}", steps=steps, save_every=4)
    if model == "missing":
        argv[argv.index("--pretrained_model_name_or_path") + 1] = str(folder / "no-such-model.safetensors")
    path = folder / f"{name}.yaml"
    path.write_text(f"command: {json.dumps(argv)}\nenv: {json.dumps(env or {})}\nrun_dir: run-{name}\n"
                    "backoff:\n  initial_s: 1\nstop:\n  grace_s: 5\n")
    return path


def _cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(trainsup_cmd(*args[:2], "--state", str(state), *args[2:]) if args[0] == "queue"
                          else trainsup_cmd(*args), capture_output=True, text=True, timeout=60, env=clean_env(),
                          check=False)


def _queue(state: Path) -> dict[str, dict[str, Any]]:
    r = _cli(state, "queue", "list", "--json")
    assert r.returncode == 0, r.stderr
    return {e["id"]: e for e in json.loads(r.stdout)}


def _serve(state: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(trainsup_cmd("serve", "--state", str(state), *extra), stdout=out, stderr=out,
                                env=clean_env())


def _supervisors(state: Path) -> list[psutil.Process]:
    """Every live ``trainsup run --project`` of this queue, whoever its parent is now."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if any(str(state / "queue") in part for part in proc.cmdline()) and proc.status() != "zombie":
                found.append(proc)
    return found


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    yield state
    for proc in _supervisors(state):  # a failed test must not leave runs going
        with contextlib.suppress(psutil.Error):
            for p in [proc, *proc.children(recursive=True)]:
                p.kill()


def _stop(daemon: subprocess.Popen[bytes]) -> int:
    daemon.send_signal(signal.SIGTERM)
    return daemon.wait(timeout=60)


def test_a_failed_entry_does_not_stop_the_queue(assets: dict[str, Path], tmp_path: Path, state: Path) -> None:
    """The issue's own check: bad.yaml (its model does not exist), good1.yaml, good2.yaml on one slot."""
    files = [_project(tmp_path / "p", "bad", assets, model="missing"), _project(tmp_path / "p", "good1", assets),
             _project(tmp_path / "p", "good2", assets)]
    receiver, port = Receiver(), free_port()  # the daemon's own notify: and metrics: sections
    policy = tmp_path / "serve.yaml"
    policy.write_text(f"notify:\n  urls: ['{receiver.url}']\n  on: [queue_empty]\n"
                      f"metrics:\n  listen: '127.0.0.1:{port}'\n")
    daemon = _serve(state, tmp_path / "serve.log", "--slots", "1", "--policy", str(policy))
    ids = []
    for path in files:
        # the missing model is refused at `queue add` (trainsup doctor): --force queues it to fail at its turn
        r = _cli(state, "queue", "add", *(["--force"] if path.stem == "bad" else []), str(path))
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.strip())
    assert ids == ["q1", "q2", "q3"]
    wait_until(lambda: all(e["state"] in ("finished", "failed") for e in _queue(state).values()), timeout=240,
               what="every entry ended")
    entries = _queue(state)
    bad, good1, good2 = (entries[i] for i in ids)
    assert (bad["state"], bad["exit_code"]) == ("failed", 4)
    assert "config_error" in bad["reason"] and "no-such-model" in bad["reason"]
    assert [(e["state"], e["exit_code"]) for e in (good1, good2)] == [("finished", 0)] * 2
    assert bad["ended"] <= good1["started"] and good1["ended"] <= good2["started"]  # one slot, in order
    for name in ("good1", "good2"):
        assert (tmp_path / "p" / f"out-{name}" / "lora.safetensors").is_file()
    assert good1["run_dir"] == str(tmp_path / "p" / "run-good1")
    status = _cli(state, "status", "--state", str(state))
    assert "0 running · 0 queued · 2 finished · 1 failed" in status.stdout
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        values = scrape(response.read().decode())
    assert values[("trainsup_queue_entries", (("state", "finished"),))] == 2
    assert values[("trainsup_queue_entries", (("state", "failed"),))] == 1
    assert values[("trainsup_run_step", (("project", "good2"),))] == 8  # each entry's run, by project
    assert values[("trainsup_run_state", (("project", "bad"), ("state", "stopped")))] == 1
    assert _stop(daemon) == 0
    receiver.close()
    assert len(receiver.bodies) == 1 and "queue is empty" in receiver.bodies[0]["title"]
    assert "2 finished · 1 failed" in receiver.bodies[0]["message"]
    events = [e["event"] for e in read_events(state)]
    assert events.count("entry_started") == 3 and events.count("entry_ended") == 3 and "queue_empty" in events


def test_pause_inbox_move_and_stop_of_one_entry(assets: dict[str, Path], tmp_path: Path, state: Path) -> None:
    slow = {"TRAINSUP_DEMO_STEP_SECONDS": "0.3"}
    first = _project(tmp_path / "p", "first", assets, steps=40, env=slow)
    second = _project(tmp_path / "p", "second", assets, steps=4)
    third = _project(tmp_path / "p", "third", assets, steps=4)
    assert _cli(state, "queue", "pause").returncode == 0
    daemon = _serve(state, tmp_path / "serve.log", "--slots", "1")
    assert _cli(state, "queue", "add", str(first)).stdout.strip() == "q1"
    (state / "inbox").mkdir(parents=True, exist_ok=True)
    drop = state / "inbox" / "second.yaml"
    drop.write_text(second.read_text().replace("run_dir: run-second", f"run_dir: {tmp_path / 'p' / 'run-second'}"))
    wait_until(lambda: "q2" in _queue(state), timeout=30, what="the inbox drop queued")
    assert (state / "inbox" / "added" / "q2-second.yaml").is_file() and not drop.exists()
    assert _cli(state, "queue", "add", str(third)).stdout.strip() == "q3"
    assert [e["state"] for e in _queue(state).values()] == ["queued"] * 3  # paused: nothing starts
    moved = _cli(state, "queue", "move", "q3", "--to", "1")
    assert moved.returncode == 0 and moved.stdout.split() == ["q3", "q1", "q2"]
    assert _cli(state, "queue", "resume").returncode == 0
    wait_until(lambda: _queue(state)["q1"]["state"] == "running", timeout=60, what="q1 starts after q3")
    assert _queue(state)["q3"]["state"] == "finished"
    log = _cli(state, "logs", "--state", str(state), "q3")  # an entry's trainer log, by its id
    assert log.returncode == 0 and "steps" in log.stdout, log.stderr
    assert _cli(state, "queue", "pause").returncode == 0  # q1 goes on; q2 must not start after it
    assert _cli(state, "queue", "remove", "q1").returncode == 1  # running: stop it, not remove it
    stop = _cli(state, "stop", "--state", str(state), "q1")
    assert stop.returncode == 0, stop.stderr
    wait_until(lambda: _queue(state)["q1"]["state"] == "stopped", timeout=30, what="q1 stopped")
    assert _queue(state)["q1"]["exit_code"] == 143
    assert _queue(state)["q2"]["state"] == "queued"
    assert _cli(state, "queue", "resume").returncode == 0
    wait_until(lambda: _queue(state)["q2"]["state"] == "finished", timeout=90, what="q2 finished")
    assert _stop(daemon) == 0


def test_inbox_files_that_are_not_utf8_text_are_rejected_and_the_daemon_runs_the_next_good_one(
        assets: dict[str, Path], tmp_path: Path, state: Path) -> None:
    """A UTF-16 file without its byte-order mark, a Latin-1 one and a binary one dropped into the inbox
    of a real ``trainsup serve``: each is moved to inbox/rejected/ beside the reason, the daemon stays
    up (it used to die with exit 70, and again at every restart), and a good drop after them runs."""
    text = _project(tmp_path / "p", "good", assets, steps=4).read_text().replace(
        "run_dir: run-good", f"run_dir: {tmp_path / 'p' / 'run-good'}")
    daemon = _serve(state, tmp_path / "serve.log", "--slots", "1")
    inbox = state / "inbox"
    inbox.mkdir(parents=True, exist_ok=True)
    bad = {"utf16.yaml": text.encode("utf-16-le"), "latin.yaml": f"{text}description: café\n".encode("latin-1"),
           "binary.yaml": bytes(range(256)) * 4}
    for name, raw in bad.items():
        (inbox / name).write_bytes(raw)
    rejected = inbox / "rejected"
    wait_until(lambda: all((rejected / f"{name}.error").exists() for name in bad), timeout=30,
               what="the three bad drops rejected")
    assert daemon.poll() is None, (tmp_path / "serve.log").read_text()
    reasons = {name: (rejected / f"{name}.error").read_text() for name in bad}
    assert "UTF-16 text without a byte-order mark; save it as UTF-8" in reasons["utf16.yaml"]
    assert "not UTF-8 text (byte 0xe9 at line " in reasons["latin.yaml"] and "save it as UTF-8" in reasons["latin.yaml"]
    assert "a binary file, not a text project file" in reasons["binary.yaml"]
    assert all((rejected / name).read_bytes() == raw for name, raw in bad.items())  # the user's files, kept
    (inbox / "good.yaml").write_text(text)
    wait_until(lambda: _queue(state).get("q1", {}).get("state") == "finished", timeout=120, what="the good drop ran")
    assert (inbox / "added" / "q1-good.yaml").is_file()
    assert (tmp_path / "p" / "out-good" / "lora.safetensors").is_file()
    assert json.loads((state / "status.json").read_text())["state"] == "serving" and daemon.poll() is None
    assert _stop(daemon) == 0
    assert json.loads((state / "status.json").read_text())["state"] == "stopped"
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
    events = [e["event"] for e in read_events(state)]
    assert events.count("inbox_rejected") == 3 and events.count("inbox_added") == 1


def test_the_daemon_killed_mid_queue_adopts_live_runs_and_resumes_dead_ones(
        assets: dict[str, Path], tmp_path: Path, state: Path) -> None:
    slow = {"TRAINSUP_DEMO_STEP_SECONDS": "0.25"}
    a = _project(tmp_path / "p", "alive", assets, steps=24, env=slow)
    b = _project(tmp_path / "p", "orphan", assets, steps=24, env=slow)
    daemon = _serve(state, tmp_path / "serve.log", "--slots", "2")
    for path in (a, b):
        assert _cli(state, "queue", "add", str(path)).returncode == 0

    def saved(name: str) -> bool:
        return any(e["event"] == "state_saved" for e in _events(tmp_path / "p" / f"run-{name}"))

    wait_until(lambda: saved("alive") and saved("orphan"), timeout=120, what="both runs saved a state")
    entries = _queue(state)
    alive_pid, orphan_pid = entries["q1"]["pid"], entries["q2"]["pid"]
    daemon.kill()  # kill -9 of trainsup serve in the middle of the queue
    daemon.wait()
    os.kill(orphan_pid, signal.SIGKILL)  # and one run's supervisor dies while no daemon watches
    wait_until(lambda: not psutil.pid_exists(orphan_pid) or psutil.Process(orphan_pid).status() == "zombie",
               timeout=10, what="the supervisor gone")
    assert psutil.pid_exists(alive_pid)
    daemon = _serve(state, tmp_path / "serve.log", "--slots", "2")
    most = 0

    def all_ended() -> bool:
        nonlocal most
        per_entry: dict[str, int] = {}
        for proc in _supervisors(state):  # never two supervisors for one entry
            with contextlib.suppress(psutil.Error):
                key = next(p for p in proc.cmdline() if str(state) in p)
                per_entry[key] = per_entry.get(key, 0) + 1
        most = max([most, *per_entry.values()])
        return all(e["state"] == "finished" for e in _queue(state).values())

    wait_until(all_ended, timeout=240, interval=0.05, what="both entries finished")
    assert most == 1
    alive, orphan = _events(tmp_path / "p" / "run-alive"), _events(tmp_path / "p" / "run-orphan")
    assert [e["event"] for e in alive].count("run_start") == 1  # adopted, not started again
    assert [e["event"] for e in orphan].count("run_start") == 2  # started again on the same run dir...
    resumed = [e for e in orphan if e["event"] == "attempt_start"][-1]
    assert resumed["resume_from"] is not None and resumed["resume_step"] > 0  # ...from its newest state
    for events in (alive, orphan):
        assert [e["event"] for e in events].count("finished") == 1  # every entry ends exactly once
    for name in ("alive", "orphan"):
        assert (tmp_path / "p" / f"out-{name}" / "lora.safetensors").is_file()
    assert _stop(daemon) == 0
    serve_events = [e["event"] for e in read_events(state)]
    assert serve_events.count("entry_adopted") == 1 and serve_events.count("entry_ended") == 2


def _events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        return read_events(run_dir)
    except (OSError, ValueError):
        return []


JOB = """import os, sys, time
open(sys.argv[1], "w").write(os.environ.get("CUDA_VISIBLE_DEVICES", "-"))
deadline = time.time() + 30
while not os.path.exists(sys.argv[2]) and time.time() < deadline:
    time.sleep(0.05)
"""


def test_each_entry_gets_a_gpu_of_its_own_by_free_memory(tmp_path: Path) -> None:
    """The daemon in-process with the fake NVML table (no GPU here): two entries on a box with three
    GPUs, one of them nearly full, run at once on the two free ones."""
    (tmp_path / "job.py").write_text(JOB)
    state = tmp_path / "state"
    table = [{"name": "H100", "used": 1 * GIB}, {"name": "H100", "used": 79 * GIB}, {"name": "H100", "used": 1 * GIB}]
    daemon = Daemon(ServeOptions(state, None, 4096, poll_s=0.1, env=clean_env()),
                    gpu_probe=lambda: gpu.probe(FakeNvml(table)))
    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text(
            f"command: [{json.dumps(sys.executable)}, job.py, gpu-{name}.txt, release]\nrun_dir: run-{name}\n"
            "restart:\n  max: 0\n")
        daemon.store.add(tmp_path / f"{name}.yaml")
    import threading

    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        wait_until(lambda: (tmp_path / "gpu-a.txt").exists() and (tmp_path / "gpu-b.txt").exists(), timeout=60,
                   what="both jobs running")
        assert daemon.slots == 3  # one per GPU
        assert sorted((tmp_path / f"gpu-{n}.txt").read_text() for n in "ab") == ["0", "2"]
        (tmp_path / "release").write_text("")
        wait_until(lambda: all(e.state != "running" for e in daemon.store.entries()), timeout=60,
                   what="both ended")
    finally:
        daemon.request_stop(signal.SIGTERM)
        thread.join(timeout=60)
    assert [e.assigned_gpus for e in daemon.store.entries()] == [["0"], ["2"]]
