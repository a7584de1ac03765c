"""A run dir on shared storage: host and boot identity, the lease, claiming a run dir, and the takeover
that never signals another host's (or an earlier boot's) pids. Real files, real locks and real
processes; a test plays another host by writing its records or by ``TRAINSUP_HOST_ID``."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from trainsup.commands.runref import RunRef
from trainsup.commands.status import format_line, view
from trainsup.commands.stop import run_stop
from trainsup.record.journal import Journal, read_events
from trainsup.record.lease import (
    EARLIER_BOOT,
    HERE,
    HOST_ENV,
    OTHER_HOST,
    Identity,
    LeaseKeeper,
    local_identity,
    origin,
    read_lease,
)
from trainsup.record.runlock import RunLock, holder
from trainsup.run.ownership import Refused, claim
from trainsup.run.policy import PolicyError, parse_policy
from trainsup.run.takeover import recover_lost_run

BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
ME = Identity("host-b", BOOT)


def _write_lease(run_dir: Path, host: str, pid: int, age_s: float, boot: str = BOOT, stale_s: float = 60) -> None:
    (run_dir / "lease.json").write_text(json.dumps({"host": host, "boot_id": boot, "pid": pid,
                                                    "renewed": time.time() - age_s, "stale_s": stale_s}))


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A live local process whose command line says trainsup: what a careless stop would signal."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "trainsup", "run"],
                            start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_identity_is_the_host_name_and_the_kernels_boot_id_and_the_env_knob_names_the_host() -> None:
    assert local_identity({}) == Identity(socket.gethostname(), BOOT)
    assert local_identity({HOST_ENV: " node-7 "}) == Identity("node-7", BOOT)
    assert len(BOOT) == 36


def test_origin_tells_here_another_host_and_an_earlier_boot_apart() -> None:
    assert origin({"host": "host-b", "boot_id": BOOT}, ME) == HERE
    assert origin({"host": "host-a", "boot_id": BOOT}, ME) == OTHER_HOST
    assert origin({"host": "host-b", "boot_id": "0f0e-earlier"}, ME) == EARLIER_BOOT
    assert origin({"pid": 5}, ME) == HERE  # written before hosts were recorded: this host's


def test_the_lease_is_renewed_when_due_released_only_by_its_owner_and_a_takeover_is_noticed(tmp_path: Path) -> None:
    now = [100.0]
    keeper = LeaseKeeper(tmp_path, ME, 8.0, clock=lambda: now[0])
    assert keeper.every_s == 2.0
    keeper.write()
    first = read_lease(tmp_path)
    assert first is not None and first.is_mine(ME, os.getpid()) and first.stale_s == 8.0
    now[0] += 1.0
    assert keeper.tick() is None and read_lease(tmp_path) == first  # not due yet: nothing written
    time.sleep(0.01)
    now[0] += 1.5
    assert keeper.tick() is None
    second = read_lease(tmp_path)
    assert second is not None and second.renewed > first.renewed
    _write_lease(tmp_path, "host-a", 4242, 0)  # another host judged this one dead and took over
    now[0] += 2.5
    lost = keeper.tick()
    assert lost is not None and lost.host == "host-a" and lost.pid == 4242
    keeper.release()
    assert read_lease(tmp_path) == lost  # not ours: left alone


def test_a_live_lease_of_another_host_refuses_the_run_and_the_lock_is_not_taken(tmp_path: Path) -> None:
    _write_lease(tmp_path, "host-a", 4242, 5)
    with pytest.raises(Refused) as err:
        claim(tmp_path, 60, ME)
    assert "host host-a (pid 4242" in str(err.value) and "lease.stale_s" in str(err.value)
    assert holder(tmp_path) is None


def test_a_stale_lease_of_another_host_is_taken_over_and_journaled(tmp_path: Path) -> None:
    _write_lease(tmp_path, "host-a", 4242, 90)
    owner = claim(tmp_path, 60, ME)
    try:
        lease = read_lease(tmp_path)
        assert lease is not None and lease.is_mine(ME, os.getpid())
        held = holder(tmp_path)
        assert held is not None and held.pid == os.getpid() and held.boot_id == BOOT
        journal = Journal(tmp_path)
        said: list[str] = []
        owner.journal_takeover(journal, said.append)
        journal.close()
        (event,) = [e for e in read_events(tmp_path) if e["event"] == "lease_taken_over"]
        assert event["host"] == "host-a" and event["pid"] == 4242 and 89 < event["age_s"] < 100
        assert event["origin"] == OTHER_HOST and "host-a" in said[0]
    finally:
        owner.release()
    assert read_lease(tmp_path) is None


def test_of_two_hosts_taking_one_stale_lease_at_once_the_one_whose_write_landed_first_refuses(tmp_path: Path) -> None:
    _write_lease(tmp_path, "host-a", 4242, 90)

    def host_c() -> None:  # another host's claim of the same stale lease, landing just after ours
        while True:
            lease = read_lease(tmp_path)
            if lease is not None and lease.host == "host-b":
                _write_lease(tmp_path, "host-c", 5353, 0)
                return
            time.sleep(0.001)

    racer = threading.Thread(target=host_c)
    racer.start()
    with pytest.raises(Refused, match="host host-c \\(pid 5353"):
        claim(tmp_path, 60, ME)
    racer.join()
    assert holder(tmp_path) is None  # the lock went with the refusal


def test_this_hosts_lease_under_a_free_lock_is_a_dead_supervisors_and_a_held_lock_refuses(tmp_path: Path) -> None:
    _write_lease(tmp_path, "host-b", 4242, 1)  # fresh, but the lock is free: its supervisor died
    owner = claim(tmp_path, 60, ME)
    assert owner.replaced is not None and owner.replaced.pid == 4242
    with pytest.raises(Refused) as err:  # a second open file of the lock: flock excludes it
        claim(tmp_path, 60, ME)
    assert f"another trainsup run holds {tmp_path} (pid {os.getpid()} on host" in str(err.value)
    owner.release()


def test_the_policy_key_lease_stale_s() -> None:
    assert parse_policy("lease:\n  stale_s: 5\n", "p.yaml").lease_stale_s == 5.0
    assert parse_policy("", "p.yaml").lease_stale_s == 60.0
    with pytest.raises(PolicyError, match="p.yaml:2: lease.stale_s: expected a number >= 1"):
        parse_policy("lease:\n  stale_s: 0\n", "p.yaml")


@pytest.mark.parametrize(("host", "boot", "why"),
                         [("host-a", BOOT, OTHER_HOST), ("host-b", "0f0e-earlier", EARLIER_BOOT)])
def test_a_trainer_record_from_another_host_or_boot_is_never_signalled(tmp_path: Path,
                                                                        bystander: subprocess.Popen[bytes],
                                                                        host: str, boot: str, why: str) -> None:
    proc = psutil.Process(bystander.pid)  # a local process that carries the recorded pid and start time
    (tmp_path / "trainer.json").write_text(json.dumps({
        "supervisor_pid": 1, "host": host, "boot_id": boot, "attempt": 1, "pgid": bystander.pid,
        "procs": [{"pid": bystander.pid, "started": proc.create_time()}]}))
    journal = Journal(tmp_path)
    journal.event("attempt_start", attempt=1)
    said: list[str] = []
    assert recover_lost_run(tmp_path, journal, said.append, 1.0, ME) == 1
    journal.close()
    time.sleep(0.2)
    assert bystander.poll() is None  # untouched
    events = read_events(tmp_path)
    (left,) = [e for e in events if e["event"] == "orphan_not_signalled"]
    assert left["why"] == why and left["pids"] == [bystander.pid] and left["host"] == host
    assert not [e for e in events if e["event"] == "orphan_stopped"]
    assert [e for e in events if e["event"] == "attempt_end" and e.get("supervisor_lost")]
    assert not (tmp_path / "trainer.json").exists() and "not signalling" in said[0]


def test_the_same_record_from_this_host_and_boot_is_stopped(tmp_path: Path, bystander: subprocess.Popen[bytes]) -> None:
    proc = psutil.Process(bystander.pid)
    (tmp_path / "trainer.json").write_text(json.dumps({
        "host": "host-b", "boot_id": BOOT, "attempt": 1, "pgid": bystander.pid,
        "procs": [{"pid": bystander.pid, "started": proc.create_time()}]}))
    journal = Journal(tmp_path)
    recover_lost_run(tmp_path, journal, lambda _m: None, 1.0, ME)
    journal.close()
    with pytest.raises(psutil.NoSuchProcess):  # stopped (and reaped: it was this test's child)
        psutil.Process(bystander.pid).status()
    assert [e for e in read_events(tmp_path) if e["event"] == "orphan_stopped"]


def test_stop_and_status_on_a_host_that_does_not_own_the_run(tmp_path: Path, bystander: subprocess.Popen[bytes],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOST_ENV, "host-b")
    (tmp_path / "status.json").write_text(json.dumps({"state": "running", "attempt": 1, "updated": time.time()}))
    # Another host's supervisor: its pid happens to be a live local trainsup-looking process.
    _write_lease(tmp_path, "host-a", bystander.pid, 2)
    err = io.StringIO()
    assert run_stop(str(tmp_path), timeout=2, env={HOST_ENV: "host-b"}, out=io.StringIO(), err=err) == 1
    assert f"is owned by host host-a (pid {bystander.pid}" in err.getvalue()
    run = view(RunRef("r", tmp_path))
    assert run.state == "running" and run.host == "host-a"  # not "lost": the lock is that host's
    assert f"pid {bystander.pid} on host-a" in format_line(run)
    # The lock itself, seen here (NFSv4 passes flock to the server), names the other host.
    lock = RunLock(tmp_path)
    monkeypatch.setenv(HOST_ENV, "host-a")
    lock.acquire()
    monkeypatch.setenv(HOST_ENV, "host-b")
    (tmp_path / "lease.json").unlink()
    err = io.StringIO()
    assert run_stop(str(tmp_path), timeout=2, env={HOST_ENV: "host-b"}, out=io.StringIO(), err=err) == 1
    assert f"is owned by host host-a (pid {os.getpid()})" in err.getvalue()
    lock.release()
    time.sleep(0.2)
    assert bystander.poll() is None


def test_the_lock_names_its_new_holder_over_a_longer_record_of_a_dead_one(tmp_path: Path) -> None:
    """The record is written over the last holder's (no truncation first: on a disk kept full, the space it
    freed would be taken before the new record is written), and none of the old one is left after it."""
    (tmp_path / "lock").write_text(json.dumps({"pid": 1, "started": 1.0, "host": "x" * 300}) + "\n")
    lock = RunLock(tmp_path)
    lock.acquire()
    try:
        record = json.loads((tmp_path / "lock").read_text())  # one record, parsed whole
        assert record["pid"] == os.getpid() and "x" * 300 not in record["host"]
        held = holder(tmp_path)
        assert held is not None and held.pid == os.getpid()
    finally:
        lock.release()
    assert holder(tmp_path) is None
