"""The queue's files, the scheduler, the inbox and the control socket: real files, real sockets, and
(for the GPU choice) the fake NVML table, since this machine has no GPU."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path

import pytest

from tests.fakenvml import GIB
from trainsup.record.journal import Journal, read_events
from trainsup.sensors.gpu import GpuDevice
from trainsup.service import inbox
from trainsup.service.control import ControlServer, ask
from trainsup.service.daemon import status_text
from trainsup.service.entryproc import entry_env, journal_ending
from trainsup.service.queuestore import (
    DuplicateEntry,
    Entry,
    QueueError,
    QueueStore,
    queued_positions,
    state_dir,
)
from trainsup.service.scheduler import plan_starts


def _project(folder: Path, name: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train_network.py").write_text("print('hi')\n")
    path = folder / f"{name}.yaml"
    path.write_text(f"command: python train_network.py --output_dir out-{name} --output_name {name}\n"
                    f"cwd: .\n{extra}")
    return path


def test_the_state_dir_comes_from_the_flag_then_the_environment_then_the_user() -> None:
    assert state_dir(Path("/x/s"), {"TRAINSUP_STATE": "/y"}) == Path("/x/s")
    assert state_dir(None, {"TRAINSUP_STATE": "/y"}) == Path("/y")
    if os.geteuid() == 0:
        assert state_dir(None, {}) == Path("/var/lib/trainsup")
    else:
        assert state_dir(None, {"XDG_STATE_HOME": "/st"}) == Path("/st/trainsup")


def test_an_entry_is_a_frozen_copy_whose_paths_still_point_at_the_project(tmp_path: Path) -> None:
    store = QueueStore(tmp_path / "state")
    original = _project(tmp_path / "proj", "lora")
    entry = store.add(original, priority=3)
    assert (entry.id, entry.project, entry.priority, entry.state) == ("q1", "lora", 3, "queued")
    copy = Path(entry.file)
    assert copy.parent == store.queue_dir / "q1" and copy.name == "lora.yaml"
    original.write_text("command: python something_else.py\n")  # an edit after queueing changes nothing
    from trainsup.run.project import load_project

    queued = load_project(copy)
    assert queued.command[:2] == ("python", "train_network.py")
    assert queued.cwd == (tmp_path / "proj").resolve()  # relative to the original, not to the copy
    assert entry.run_dir == str((tmp_path / "proj" / "out-lora" / ".trainsup").resolve())
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700


def test_an_invalid_project_is_refused_with_its_line_and_nothing_is_queued(tmp_path: Path) -> None:
    store = QueueStore(tmp_path / "state")
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: [python, t.py]\nrestart:\n  max: five\n")
    with pytest.raises(QueueError, match=r"bad.yaml:3: restart.max: expected an integer >= 0"):
        store.add(bad)
    assert store.entries() == []


def test_gpus_given_at_add_win_over_the_projects_own(tmp_path: Path) -> None:
    store = QueueStore(tmp_path / "state")
    path = _project(tmp_path / "p", "a", "gpus: [0, 1]\n")
    assert store.add(path).gpus == ["0", "1"]
    store.remove("q1")
    entry = store.add(path, gpus=["3"])
    assert entry.gpus == ["3"]
    assert "'3'" in Path(entry.file).read_text() or "- '3'" in Path(entry.file).read_text()


def test_order_is_priority_then_arrival_and_move_reorders_the_waiting(tmp_path: Path) -> None:
    store = QueueStore(tmp_path / "state")
    paths = [_project(tmp_path / "p", f"a{n}") for n in range(4)]
    for path, prio in zip(paths, (0, 0, 5, 0), strict=True):
        store.add(path, priority=prio)
    assert [e.id for e in store.entries()] == ["q3", "q1", "q2", "q4"]
    order = store.move("q4", 1)
    assert [e.id for e in order] == ["q4", "q3", "q1", "q2"]
    assert [e.id for e in store.entries()] == ["q4", "q3", "q1", "q2"]  # the files say so, not memory
    assert store.get("q4").priority == 5  # it took its new neighbour's priority so the order holds
    store.move("q3", 4)
    assert list(queued_positions(store.entries())) == ["q4", "q1", "q2", "q3"]
    with pytest.raises(QueueError, match="expected a position from 1 to 4"):
        store.move("q1", 9)
    with store.locked():
        store.update("q2", state="running")
    with pytest.raises(QueueError, match="q2 is running; only queued entries move"):
        store.move("q2", 1)
    with pytest.raises(QueueError, match="q2 is running; stop it first"):
        store.remove("q2")
    assert store.remove("q1").id == "q1" and not (store.queue_dir / "q1").exists()
    with pytest.raises(QueueError, match="no queue entry 'q1'"):
        store.get("q1")
    assert store.add(paths[0]).id == "q5"  # ids are never reused


def test_ids_are_never_reused_even_after_the_newest_entries_are_removed(tmp_path: Path) -> None:
    store = QueueStore(tmp_path / "state")
    paths = [_project(tmp_path / "p", f"a{n}") for n in range(5)]
    assert [store.add(p).id for p in paths[:3]] == ["q1", "q2", "q3"]
    for entry_id in ("q3", "q2", "q1"):
        store.remove(entry_id)
    assert store.entries() == []
    assert store.add(paths[3]).id == "q4"
    assert store.seq_file.read_text() == "4\n"
    store.seq_file.write_text("garbage")  # an unreadable counter: the folders still count
    assert store.add(paths[4]).id == "q5"


def test_a_queue_from_before_the_counter_goes_on_from_its_highest_id(tmp_path: Path) -> None:
    store = QueueStore(tmp_path / "state")
    paths = [_project(tmp_path / "p", f"a{n}") for n in range(5)]
    for p in paths[:3]:
        store.add(p)
    store.seq_file.unlink()  # as an older trainsup left it: entries, no counter
    (store.queue_dir / "q7").mkdir()  # and a folder an interrupted add left without its entry.json
    assert store.add(paths[3]).id == "q8"
    store.seq_file.unlink()
    store.remove("q8")  # removing the newest entry of a counterless queue spends its id all the same
    store.remove("q3")
    (store.queue_dir / "q7").rmdir()
    assert store.add(paths[4]).id == "q9"


def test_a_project_already_queued_or_running_is_refused_naming_its_entry(tmp_path: Path) -> None:
    store = QueueStore(tmp_path / "state")
    path = _project(tmp_path / "p", "lora")
    store.add(path)
    with pytest.raises(DuplicateEntry, match=r"lora.yaml: already in the queue as q1 \(queued; project lora, same "
                                             r"file\); remove it first \(trainsup queue remove q1\)"):
        store.add(path)
    same_run_dir = tmp_path / "p" / "lora-copy.yaml"  # another file writing to the same run dir
    same_run_dir.write_text(path.read_text())
    with store.locked():
        store.update("q1", state="running")
    with pytest.raises(DuplicateEntry, match=r"lora-copy.yaml: already in the queue as q1 \(running; project lora, "
                                             r"same run dir .*out-lora/.trainsup\); "
                                             r"stop it first \(trainsup stop q1\)"):
        store.add(same_run_dir)
    other_folder = _project(tmp_path / "elsewhere", "lora")  # the same name is another project
    assert store.add(other_folder).id == "q2"
    with store.locked():
        store.update("q1", state="finished")
    assert store.add(path).id == "q3"  # an ended entry does not hold its project back
    assert [e.id for e in store.entries() if e.state == "queued"] == ["q2", "q3"]


def _entry(n: int, **kw: object) -> Entry:
    fields: dict[str, object] = {"id": f"q{n}", "seq": n, "project": f"p{n}", "file": f"/s/q{n}/p.yaml",
                                 "source": "", "run_dir": f"/runs/{n}", "position": float(n)}
    fields.update(kw)
    return Entry(**fields)  # type: ignore[arg-type]


def _gpu(index: int, free_gib: float) -> GpuDevice:
    return GpuDevice(index, "H100", 80 * GIB, int((80 - free_gib) * GIB), int(free_gib * GIB), (),
                     uuid=f"GPU-{index}")


def test_slots_bound_the_starts_and_a_busy_run_dir_waits_without_holding_back_others() -> None:
    entries = [_entry(1, state="running"), _entry(2), _entry(3, run_dir="/runs/1"), _entry(4), _entry(5)]
    starts = plan_starts(entries, slots=3, paused=False, devices=None)
    assert [s.entry.id for s in starts] == ["q2", "q4"]  # q3 shares q1's run dir
    assert all(s.gpus is None for s in starts)
    assert plan_starts(entries, slots=3, paused=True, devices=None) == []
    assert [s.entry.id for s in plan_starts(entries, slots=2, paused=False, devices=None,
                                            busy_run_dirs=["/runs/2"])] == ["q4"]


def test_gpus_go_to_named_entries_when_free_and_to_others_by_free_memory() -> None:
    devices = [_gpu(0, 70), _gpu(1, 1), _gpu(2, 70)]
    entries = [_entry(1, state="running", assigned_gpus=["0"]), _entry(2, gpus=["0", "2"]), _entry(3), _entry(4)]
    starts = plan_starts(entries, slots=4, paused=False, devices=devices, min_free_bytes=8 * GIB)
    # q2 wants GPU 0, which q1 holds: it waits; q3 gets GPU 2 (GPU 1 is nearly full); q4 finds none left
    assert [(s.entry.id, s.gpus) for s in starts] == [("q3", ["2"])]
    entries[0] = _entry(1, state="finished")
    starts = plan_starts(entries, slots=4, paused=False, devices=devices, min_free_bytes=8 * GIB)
    assert [(s.entry.id, s.gpus) for s in starts] == [("q2", ["0", "2"])]


def test_the_inbox_queues_settled_files_and_moves_rejects_aside_with_the_reason(tmp_path: Path) -> None:
    store = QueueStore(tmp_path / "state")
    store.ensure()
    journal = Journal(store.root)
    said: list[str] = []
    good = store.inbox / "lora.yaml"
    good.write_text(_project(tmp_path / "p", "lora").read_text().replace("cwd: .", f"cwd: {tmp_path / 'p'}"))
    bad = store.inbox / "broken.yaml"
    bad.write_text("command: [python, t.py\n")
    (store.inbox / ".lora.yaml.swp").write_text("x")
    assert inbox.take(store, journal, said.append, now=lambda: time.time() - 10) is True  # too fresh: later
    assert store.entries() == []
    assert inbox.take(store, journal, said.append, now=lambda: time.time() + 10) is False
    entries = store.entries()
    assert [(e.id, e.project) for e in entries] == [("q1", "lora")]
    assert (store.inbox / "added" / "q1-lora.yaml").exists() and not good.exists()
    error = (store.inbox / "rejected" / "broken.yaml.error").read_text()
    assert "broken.yaml:2" in error and "malformed YAML" in error
    assert (store.inbox / "rejected" / "broken.yaml").exists()  # the user's file is kept, never deleted
    assert (store.inbox / ".lora.yaml.swp").exists()
    journal.close()
    kinds = [e["event"] for e in read_events(store.root)]
    assert sorted(kinds) == ["inbox_added", "inbox_rejected"]


def test_an_inbox_file_that_is_not_text_a_duplicate_or_anything_else_bad_is_rejected_never_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = QueueStore(tmp_path / "state")
    store.ensure()
    journal = Journal(store.root)
    said: list[str] = []
    text = _project(tmp_path / "p", "lora").read_text().replace("cwd: .", f"cwd: {tmp_path / 'p'}")
    drops = {"utf16.yaml": text.encode("utf-16-le"), "latin.yaml": (text + "description: café\n").encode("latin-1"),
             "binary.yaml": bytes(range(256)), "lora.yaml": text.encode()}
    for name, raw in drops.items():
        (store.inbox / name).write_bytes(raw)

    def later() -> float:  # every drop has settled
        return time.time() + 10

    assert inbox.take(store, journal, said.append, now=later) is False
    assert [(e.id, e.project) for e in store.entries()] == [("q1", "lora")]
    (store.inbox / "lora.yaml").write_bytes(text.encode())  # the same drop again while q1 waits
    inbox.take(store, journal, said.append, now=later)
    rejected = store.inbox / "rejected"
    errors = {p.name: p.read_text() for p in rejected.glob("*.error")}
    assert "UTF-16 text without a byte-order mark; save it as UTF-8" in errors["utf16.yaml.error"]
    assert "not UTF-8 text (byte 0xe9 at line 3, column 17); save it as UTF-8" in errors["latin.yaml.error"]
    assert "a binary file, not a text project file" in errors["binary.yaml.error"]
    assert "already in the queue as q1 (queued; project lora, same file)" in errors["lora.yaml.error"]
    assert sorted(p.name for p in rejected.iterdir() if p.suffix == ".yaml") == sorted(drops)  # kept, never deleted

    def broken(*_args: object, **_kw: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(store, "add", broken)  # anything unexpected with one file rejects that file
    (store.inbox / "odd.yaml").write_text(text)
    assert inbox.take(store, journal, said.append, now=later) is False
    assert "cannot be queued (RuntimeError: a bug)" in (rejected / "odd.yaml.error").read_text()
    journal.close()
    kinds = [e["event"] for e in read_events(store.root)]
    assert kinds.count("inbox_rejected") == 5 and kinds.count("inbox_added") == 1


def test_the_control_socket_is_the_owners_alone_and_answers_through_the_loop(tmp_path: Path) -> None:
    import queue as q
    import threading

    store = QueueStore(tmp_path / "state")
    store.ensure()
    events: q.Queue[tuple[str, object]] = q.Queue()
    server = ControlServer(store.socket_path, events)
    server.start()
    try:
        assert stat.S_IMODE(store.socket_path.stat().st_mode) == 0o600
        assert stat.S_ISSOCK(store.socket_path.stat().st_mode)

        def loop() -> None:
            kind, request = events.get(timeout=5)
            assert kind == "control"
            request.answer({"ok": True, "echo": request.body["op"]})  # type: ignore[attr-defined]

        t = threading.Thread(target=loop)
        t.start()
        assert ask(store.socket_path, {"op": "wake"}) == {"ok": True, "echo": "wake"}
        t.join()
        with socket.socket(socket.AF_UNIX) as raw:  # garbage gets an answer, not a dead daemon
            raw.connect(str(store.socket_path))
            raw.sendall(b"[1, 2]\n")
            assert json.loads(raw.recv(4096)) == {"ok": False, "error": "expected one JSON object on one line"}
    finally:
        server.stop()
    assert not store.socket_path.exists()
    assert ask(store.socket_path, {"op": "wake"}) is None  # no daemon: the caller is told so


def test_an_entrys_ending_is_the_last_supervisors_end_in_its_journal(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"ts": 100, "event": "run_start"}, {"ts": 101, "event": "gave_up", "exit_code": 143, "reason": "x"},
             {"ts": 200, "event": "run_start"},
             {"ts": 201, "event": "fault", "class": "config_error", "evidence": "FileNotFoundError: nope.st"},
             {"ts": 202, "event": "gave_up", "exit_code": 4, "reason": "config_error: wrong"}]
    (run / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:3]))
    entry = _entry(1, run_dir=str(run), started=99.0)
    assert journal_ending(entry) is None  # a second supervisor started and has not ended
    (run / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "{torn")
    ending = journal_ending(entry)
    assert ending is not None and (ending.state, ending.exit_code) == ("failed", 4)
    assert ending.reason == "config_error: wrong (FileNotFoundError: nope.st)"
    assert journal_ending(_entry(1, run_dir=str(run), started=300.0)) is None  # an older run is not this entry's


def test_the_status_line_reads_like_the_issue_asks() -> None:
    n = {"running": 2, "queued": 3, "finished": 5, "failed": 1, "stopped": 0}
    assert status_text(n, False) == "2 running · 3 queued · 5 finished · 1 failed"
    assert status_text({**n, "stopped": 1}, True).endswith("1 failed · 1 stopped · paused")


def test_an_entrys_supervisor_gets_its_gpus_no_systemd_socket_and_trainsups_own_exit_codes() -> None:
    env = entry_env(["1", "3"], {"PATH": "/bin", "NOTIFY_SOCKET": "/run/x", "TRAINSUP_EXIT_CODES": "remapped"})
    assert env == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1,3", "TRAINSUP_EXIT_CODES": "native"}
