"""A queue that checks first: `queue add` and `queue retry` run the adapter's doctor on the project and
refuse its blockers (naming the flag and the file) unless --force; `queue retry` queues a failed or
stopped entry again as a new entry; `queue list` says when each entry started and ended and how long
it took; a stop's reason is never another fault's line. The doctor is a seam here (``check``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from trainsup.commands.doctor import Report
from trainsup.commands.queue import duration_s, queue_text, run_queue
from trainsup.record.journal import Journal
from trainsup.run.project import Project
from trainsup.service.entryproc import journal_ending
from trainsup.service.queuestore import QueueStore
from trainsup.trainers.base import Finding

MISSING = Finding("blocker", "missing_model", "--pretrained_model_name_or_path /m/model.safetensors: no such file",
                  "give the path of an existing model file")


def _project(folder: Path, name: str = "lora") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(f"command: python train_network.py --output_dir out-{name} --output_name {name}\ncwd: .\n")
    return path


def _queue(verb: str, state: Path, checked: list[str] | None = None, report: Report | None = None,
           **kw: object) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    def check(project: Project, env: object) -> Report:
        if checked is not None:
            checked.append(project.name)
        return report if report is not None else Report([Finding("info", "python", "fine")])

    code = run_queue(verb, state=state, env={}, out=out, err=err, check=check, **kw)  # type: ignore[arg-type]
    return code, out.getvalue(), err.getvalue()


def test_add_refuses_a_project_that_would_fail_at_its_start_unless_forced(tmp_path: Path) -> None:
    state, project = tmp_path / "state", _project(tmp_path / "p")
    checked: list[str] = []
    code, out, err = _queue("add", state, checked, Report([MISSING]), project=str(project))
    assert code == 2 and out == "" and checked == ["lora"]
    [line] = err.splitlines()
    assert line.startswith("trainsup queue: error: lora would fail at its start: --pretrained_model_name_or_path "
                           "/m/model.safetensors: no such file (fix: give the path of an existing model file)")
    assert str(project) in line and "--force" in line
    assert QueueStore(state).entries() == []

    code, out, err = _queue("add", state, None, Report([MISSING]), project=str(project), force=True)
    assert code == 0 and out.strip() == "q1"
    assert "warning: queued anyway (--force)" in err and "/m/model.safetensors" in err


def test_retry_queues_an_ended_entry_again_as_a_new_entry_from_its_file_as_it_is_now(tmp_path: Path) -> None:
    state, project = tmp_path / "state", _project(tmp_path / "p")
    store = QueueStore(state)
    assert _queue("add", state, project=str(project), priority=2, gpus="1")[0] == 0
    with store.locked():
        store.update("q1", state="running")
    code, _, err = _queue("retry", state, entry_id="q1")
    assert code == 1 and "only a failed or stopped entry is retried; it is running" in err
    with store.locked():
        store.update("q1", state="failed", exit_code=4, reason="config_error: no such file", started=100.0,
                     ended=160.0)
    project.write_text(project.read_text().replace("train_network.py", "train_network.py --fixed"))
    checked: list[str] = []
    code, out, err = _queue("retry", state, checked, entry_id="q1")
    assert code == 0 and out.strip() == "q2" and checked == ["lora"]
    new, old = store.get("q2"), store.get("q1")
    assert (new.state, new.retry_of, new.priority, new.gpus, new.run_dir) == ("queued", "q1", 2, ["1"], old.run_dir)
    assert "--fixed" in Path(new.file).read_text()  # the file as it is now
    assert old.state == "failed" and old.exit_code == 4  # the record of what happened stays
    assert "q2 runs lora again (q1 failed" in err
    code, _, err = _queue("retry", state, report=Report([MISSING]), entry_id="q1")
    assert code == 2 and "would fail at its start" in err  # checked as an add is


def test_the_list_says_when_each_entry_started_ended_and_how_long_it_took(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for name in ("a", "b", "c"):
        _queue("add", state, project=str(_project(tmp_path / "p", name)))
    store = QueueStore(state)
    with store.locked():
        store.update("q1", state="finished", exit_code=0, reason="training finished", started=1000.0, ended=1125.0)
        store.update("q2", state="running", started=1100.0)
    text = queue_text(store, store.entries(), now=1200.0)
    header, columns, *rows = text.splitlines()
    assert header.startswith(f"queue {state}: 1 running")
    assert columns.split() == ["id", "state", "#", "project", "started", "ended", "took", "exit", "reason"]
    q1 = next(r for r in rows if r.split()[0] == "q1")
    assert "2m05s" in q1 and q1.split()[-3:] == ["0", "training", "finished"]  # the code in a column of its own
    assert "1m40s…" in next(r for r in rows if r.split()[0] == "q2")
    assert "–" in next(r for r in rows if r.split()[0] == "q3")
    assert duration_s(store.get("q1"), 5000.0) == 125.0 and duration_s(store.get("q3"), 5000.0) is None
    out = io.StringIO()
    run_queue("list", state=state, env={}, out=out, err=io.StringIO(), as_json=True)
    listed = {e["id"]: e for e in json.loads(out.getvalue())}
    assert (listed["q1"]["duration_s"] == 125.0 and listed["q1"]["started"] == 1000.0
            and listed["q3"]["duration_s"] is None)


def test_a_stopped_entrys_reason_is_the_stop_not_an_earlier_faults_line(tmp_path: Path) -> None:
    store = QueueStore(tmp_path / "state")
    run_dir = tmp_path / "run"
    project = _project(tmp_path / "p")
    project.write_text(project.read_text() + f"run_dir: {run_dir}\n")
    entry = store.add(project)
    run_dir.mkdir()
    journal = Journal(run_dir)
    journal.event("run_start", run_dir=str(run_dir))
    journal.event("fault", **{"class": "cuda_oom"}, evidence="torch.OutOfMemoryError: CUDA out of memory.", attempt=1)
    journal.event("gave_up", reason="stopped by SIGTERM", exit_code=143)
    journal.close()
    ending = journal_ending(entry)
    assert ending is not None and (ending.state, ending.reason) == ("stopped", "stopped by SIGTERM")
