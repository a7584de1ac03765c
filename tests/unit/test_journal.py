"""The journal keeps whole lines whatever the disk does (issue 29): a write cut by a full disk is taken
back and its records follow on lines of their own once space returns; a last line cut by a killed
writer is taken off at open and kept as text; the run's end is written from the reserve; and the next
supervisor says when the previous one left no end. The disk is filled through the journal's
``write=`` seam: ``FakeDisk`` counts the run dir's real files against a capacity, so freeing the
reserve (a real preallocated file) gives real room back."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from trainsup.record.journal import HELD_MAX_BYTES, RESERVE_BYTES, RESERVE_NAME, Journal, read_events
from trainsup.run.takeover import take_over


class FakeDisk:
    """``os.write`` on a disk of ``capacity`` bytes, the run dir's files counted as used (by size).
    ``cut_at``: let one write take that many bytes only, then report no space (a short write)."""

    def __init__(self, run_dir: Path, capacity: int | None = None) -> None:
        self.run_dir, self.capacity = run_dir, capacity
        self.writes = 0

    def free(self) -> int:
        if self.capacity is None:
            return 1 << 40
        used = sum(p.stat().st_size for p in self.run_dir.iterdir() if p.is_file())
        return max(self.capacity - used, 0)

    def fill(self) -> None:
        self.capacity = self.capacity_used()

    def capacity_used(self) -> int:
        return sum(p.stat().st_size for p in self.run_dir.iterdir() if p.is_file())

    def __call__(self, fd: int, data: bytes) -> int:
        self.writes += 1
        room = self.free()
        if room == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data[:room])  # a short write when the line does not fit


def lines(run_dir: Path) -> list[bytes]:
    data = (run_dir / "events.jsonl").read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return data.split(b"\n")[:-1]


def parsed(run_dir: Path) -> list[str]:
    """Every line parses (the journal invariant); the event names in order."""
    return [json.loads(line)["event"] for line in lines(run_dir)]


def test_a_record_cut_by_a_full_disk_is_taken_back_and_written_whole_once_space_returns(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    disk = FakeDisk(tmp_path)
    journal = Journal(tmp_path, write=disk)
    journal.event("run_start", argv=["train.py"])
    disk.capacity = disk.capacity_used() + 40  # room for part of the next record only
    journal.event("fault", evidence="OSError: [Errno 28] No space left on device " * 3)
    assert parsed(tmp_path) == ["run_start"]  # the 40 bytes that fitted are taken back
    journal.event("attempt_end", attempt=1)  # no room either: held, in order
    assert parsed(tmp_path) == ["run_start"]
    disk.capacity = None  # space returns
    journal.event("remedy", rung=0)
    assert parsed(tmp_path) == ["run_start", "fault", "attempt_end", "remedy"]
    journal.close()
    assert [e["event"] for e in read_events(tmp_path)] == ["run_start", "fault", "attempt_end", "remedy"]
    err = capsys.readouterr().err.splitlines()
    said = (f"trainsup: cannot write {tmp_path / 'events.jsonl'}: No space left on device; its records are "
            "held and written when space returns; supervision goes on")
    assert err == [said] and journal.write_errors >= 2


def test_the_end_record_is_written_from_the_reserve_with_the_records_held_before_it(tmp_path: Path) -> None:
    disk = FakeDisk(tmp_path)
    journal = Journal(tmp_path, write=disk)
    assert (tmp_path / RESERVE_NAME).stat().st_size == RESERVE_BYTES
    journal.event("run_start")
    disk.fill()  # not one byte free: the reserve is all there is
    journal.event("fault", **{"class": "disk_full"})
    journal.event("attempt_end", attempt=1, exit_code=1)
    assert parsed(tmp_path) == ["run_start"] and (tmp_path / RESERVE_NAME).exists()  # kept for the end
    journal.event("gave_up", reason="disk_full: the disk is full", exit_code=4)
    assert parsed(tmp_path) == ["run_start", "fault", "attempt_end", "gave_up"]
    assert not (tmp_path / RESERVE_NAME).exists()  # spent
    journal.status(state="stopped", exit_code=4)  # the snapshot after the end: status.json's own write
    journal.close()
    assert json.loads((tmp_path / "status.json").read_text())["state"] == "stopped"


def test_records_that_outgrow_memory_are_counted_in_records_lost(tmp_path: Path) -> None:
    disk = FakeDisk(tmp_path)
    journal = Journal(tmp_path, write=disk)
    disk.fill()
    n = HELD_MAX_BYTES // 100 + 20
    for i in range(n):
        journal.event("state_saved", step=i, pad="x" * 60)
    journal.event("finished", reason="training finished")  # from the reserve
    journal.close()
    events = read_events(tmp_path)
    assert events[0]["event"] == "records_lost" and events[0]["records"] > 0
    saved = [e["step"] for e in events if e["event"] == "state_saved"]
    assert saved == list(range(n - len(saved), n)) and events[0]["records"] + len(saved) == n  # the newest, in order
    assert events[-1]["event"] == "finished" and parsed(tmp_path)[-1] == "finished"


def test_a_cut_last_line_is_taken_off_at_open_and_kept_as_text(tmp_path: Path) -> None:
    head = b'{"ts": 1.0, "event": "run_start"}\n{"ts": 2.0, "event": "attempt_start", "attempt": 1}\n'
    cut = b'{"ts": 3.0, "event": "fault", "evidence": "No space left on dev'
    (tmp_path / "events.jsonl").write_bytes(head + cut)
    journal = Journal(tmp_path)
    assert journal.opened_size == len(head)
    journal.event("run_start")
    journal.close()
    assert parsed(tmp_path) == ["run_start", "attempt_start", "journal_line_cut", "run_start"]
    (mended,) = [e for e in read_events(tmp_path) if e["event"] == "journal_line_cut"]
    assert mended["bytes"] == len(cut) and mended["text"] == cut.decode()


def test_a_line_that_cannot_be_taken_back_is_ended_before_the_next_record(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    disk = FakeDisk(tmp_path)
    journal = Journal(tmp_path, write=disk)
    journal.event("run_start")

    def no_truncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "ftruncate refused")

    monkeypatch.setattr(os, "ftruncate", no_truncate)  # an OS primitive, not the journal's internals
    disk.capacity = disk.capacity_used() + 30
    journal.event("fault", evidence="x" * 200)  # 30 bytes land and stay
    disk.capacity = None
    journal.event("attempt_end", attempt=1)
    journal.close()
    raw = lines(tmp_path)
    assert len(raw) == 4 and len(raw[1]) == 30  # run_start, the cut 30 bytes on their own line, then whole
    assert [e["event"] for e in read_events(tmp_path)] == ["run_start", "fault", "attempt_end"]


def test_line_breaks_that_json_keeps_are_escaped(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    evidence = "a\x85b\u2028c\u2029d \udcff"
    journal.event("fault", evidence=evidence)
    journal.close()
    assert len(lines(tmp_path)) == 1
    assert (tmp_path / "events.jsonl").read_text(encoding="utf-8").splitlines() == \
        [(tmp_path / "events.jsonl").read_text(encoding="utf-8").rstrip("\n")]
    (event,) = read_events(tmp_path)
    assert event["evidence"] == evidence


def test_the_next_supervisor_says_when_the_previous_one_left_no_end(tmp_path: Path) -> None:
    first = Journal(tmp_path, clock=lambda: 1000.0)
    first.event("run_start")
    first.event("attempt_start", attempt=2)
    first.event("fault", **{"class": "disk_full"})
    first.status(state="stopped", exit_code=4, reason="disk_full: the disk is full")
    first.close()  # no end record: as a killed supervisor (or one with no room at all) leaves it
    said: list[str] = []
    second = Journal(tmp_path, clock=lambda: 2000.0)
    second.event("lease_taken_over")  # the new supervisor's own records are not the previous one's
    take_over(tmp_path, second, said.append, 1.0)
    second.close()
    (known,) = [e for e in read_events(tmp_path) if e["event"] == "previous_end_unrecorded"]
    assert known["started"] == 1000.0 and known["last_event"] == "fault" and known["fault"] == "disk_full"
    assert known["attempt"] == 2 and known["status_state"] == "stopped" and known["exit_code"] == 4
    line = [s for s in said if "left no end" in s]
    assert len(line) == 1 and "fault disk_full (attempt 2)" in line[0] and "exit 4" in line[0], said
    assert "None" not in line[0]


def test_a_recorded_end_or_a_fresh_run_dir_says_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    fresh = Journal(tmp_path)
    take_over(tmp_path, fresh, said.append, 1.0)
    fresh.event("run_start")
    fresh.event("gave_up", exit_code=4)
    fresh.close()
    again = Journal(tmp_path)
    take_over(tmp_path, again, said.append, 1.0)
    again.close()
    assert said == [] and "previous_end_unrecorded" not in [e["event"] for e in read_events(tmp_path)]


def test_a_run_whose_status_says_finished_sets_its_ledger_aside_though_the_journal_lacks_the_end(
        tmp_path: Path) -> None:
    first = Journal(tmp_path)
    first.event("run_start")
    first.status(state="finished", exit_code=0, reason="training finished")
    first.close()
    (tmp_path / "ledger.json").write_text("{}")
    second = Journal(tmp_path)
    take_over(tmp_path, second, lambda _m: None, 1.0)
    second.close()
    assert (tmp_path / "ledger-1.json").exists() and not (tmp_path / "ledger.json").exists()


def test_the_curve_never_holds_a_cut_line_on_a_full_disk(tmp_path: Path) -> None:
    """progress.jsonl: a write the disk cuts short is taken back, so the next point starts a line."""
    from trainsup.record.progress import ProgressLog

    full = {"on": False}

    def write(fd: int, data: bytes) -> int:
        if full["on"]:
            return os.write(fd, data[:7])  # the disk took 7 bytes of the line, then was full
        return os.write(fd, data)

    log = ProgressLog(write=write)
    journal = Journal(tmp_path)
    journal.listen(log)
    journal.status(state="running", attempt=1, step=1, total=3)
    full["on"] = True
    journal.status(step=2)
    full["on"] = False
    journal.status(step=3)
    log.close()
    journal.close()
    lines = (tmp_path / "progress.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["s"] for line in lines] == [1, 3] and log.write_errors == 1
