"""The box's index of runs (``record.runindex``): where it is, what an entry says, which entries a
reader lists (a run dir that is gone: dropped, its file deleted; an old one: kept, not listed)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from trainsup.record.journal import Journal
from trainsup.record.runindex import (
    RECENT_S,
    Registrar,
    entry_name,
    index_dir,
    index_dirs,
    register,
    registered,
    state_root,
)
from trainsup.service.queuestore import state_dir


def test_where_the_index_is(tmp_path: Path) -> None:
    assert index_dir({"TRAINSUP_RUNS": str(tmp_path / "i")}) == tmp_path / "i"
    assert index_dir({"TRAINSUP_STATE": str(tmp_path / "s")}) == tmp_path / "s" / "runs"
    if os.geteuid() != 0:
        home = {"HOME": str(tmp_path), "XDG_STATE_HOME": ""}
        assert index_dir(home) == tmp_path / ".local" / "state" / "trainsup" / "runs"
        assert index_dirs(home) == [tmp_path / ".local/state/trainsup/runs", Path("/var/lib/trainsup/runs")]
    assert index_dirs({"TRAINSUP_STATE": str(tmp_path)}) == [tmp_path / "runs"]  # a test's, alone
    for env in ({"TRAINSUP_STATE": str(tmp_path)}, {"HOME": str(tmp_path)}):
        assert state_dir(None, env) == state_root(env)  # the queue's state dir: the same convention


def test_an_entry_per_run_dir_rewritten_by_a_later_supervisor(tmp_path: Path) -> None:
    env = {"TRAINSUP_RUNS": str(tmp_path / "index")}
    run_dir = tmp_path / "out" / ".trainsup"
    run_dir.mkdir(parents=True)
    path = register(run_dir, "lora", ["python", "train.py"], env, clock=lambda: 100.0)
    assert path.name == entry_name(run_dir) == entry_name(tmp_path / "out" / ".." / "out" / ".trainsup")
    data = json.loads(path.read_text())
    assert data["run_dir"] == str(run_dir) and data["name"] == "lora" and data["pid"] == os.getpid()
    assert data["argv"] == ["python", "train.py"] and data["registered"] == 100.0
    register(run_dir, "lora", [], env, clock=lambda: 200.0)
    assert [p.name for p in (tmp_path / "index").iterdir()] == [path.name]  # one file, rewritten
    [entry] = registered(env, now=300.0)
    assert entry.run_dir == run_dir and entry.pid == os.getpid() and entry.host


def test_a_reader_drops_gone_run_dirs_and_lists_only_recent_ones(tmp_path: Path) -> None:
    env = {"TRAINSUP_RUNS": str(tmp_path / "index")}
    dirs = {name: tmp_path / name for name in ("new", "old", "gone")}
    for d in dirs.values():
        d.mkdir()
        (d / "status.json").write_text("{}")
        register(d, d.name, [], env, clock=lambda: 0.0)
    week_ago = 1_000_000.0 - RECENT_S - 60
    os.utime(dirs["old"] / "status.json", (week_ago, week_ago))
    os.utime(dirs["new"] / "status.json", (1_000_000.0 - 5, 1_000_000.0 - 5))
    shutil.rmtree(dirs["gone"])
    (tmp_path / "index" / "junk.json").write_text("{not json")
    (tmp_path / "index" / "other.json").write_text('{"run_dir": 3}')
    assert [e.name for e in registered(env, now=1_000_000.0)] == ["new"]
    assert sorted(e.name for e in registered(env, now=1_000_000.0, within_s=None)) == ["new", "old"]
    assert not (tmp_path / "index" / entry_name(dirs["gone"])).exists()  # dropped with its run dir
    assert (tmp_path / "index" / entry_name(dirs["old"])).exists()  # kept: it may run again


def test_a_supervisor_registers_at_its_run_start_and_an_index_it_cannot_write_stops_nothing(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    registrar = Registrar({"TRAINSUP_RUNS": str(tmp_path / "index")})
    journal = Journal(run_dir)
    journal.listen(registrar)
    journal.event("run_start", argv=["python", "t.py"], run_dir=str(run_dir), project="mine")
    journal.close()
    assert registrar.path is not None and json.loads(registrar.path.read_text())["name"] == "mine"

    (tmp_path / "file").write_text("")
    blocked = Registrar({"TRAINSUP_RUNS": str(tmp_path / "file" / "index")})  # under a file: cannot be made
    blocked.on_event({"event": "run_start", "run_dir": str(run_dir), "project": "mine", "argv": []})
    assert blocked.write_errors == 1 and blocked.path is None
