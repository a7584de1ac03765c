"""The page's safety and reading, through Flask's test client over run dirs written here.

What a browser does with the page (live refresh, the stop button on a real run) is tests/web's; here:
the token and who may do what, CSRF, the Host check, which files are served (traversal, symlinks out,
huge files), a broken journal line and a missing run dir shown as such, the incremental journal
reader, the downsampling of a very long curve, and progress.jsonl as the supervisor writes it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from trainsup.record.journal import Journal
from trainsup.record.progress import ProgressLog
from trainsup.service.queuestore import QueueStore
from trainsup.web import plots
from trainsup.web.app import create_app
from trainsup.web.auth import COOKIE, Guard, load_token
from trainsup.web.files import MAX_FILE
from trainsup.web.journals import JsonlTail
from trainsup.web.runs import Catalog, run_id

PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


def write_run(out: Path, *, steps: int = 12, fault_at: int | None = 6, extra_lines: str = "") -> Path:
    """An output dir with a run dir as a supervisor leaves it: journal, status, progress, a log, samples."""
    run_dir = out / ".trainsup"
    run_dir.mkdir(parents=True)
    (out / "sample").mkdir()
    t0 = 1_790_000_000.0
    events: list[dict[str, Any]] = [
        {"ts": t0, "event": "run_start", "project": "lora", "trainer": "kohya",
         "samples": {"dirs": [str(out / "sample")], "step_pattern": r"(?:^|_)(\d{6})_\d{2}\.png$",
                     "absolute_steps": False}},
        {"ts": t0 + 1, "event": "attempt_start", "attempt": 1, "resume_from": None, "resume_step": 0}]
    progress = []
    for s in range(1, (fault_at or steps) + 1):
        progress.append({"ts": t0 + 1 + s, "a": 1, "s": s, "t": steps, "l": 1.0 / s, "r": 2.0})
    if fault_at:
        events += [{"ts": t0 + 20, "event": "attempt_end", "attempt": 1, "exit_code": 1, "step": fault_at},
                   {"ts": t0 + 20, "event": "fault", "class": "cuda_oom", "attempt": 1,
                    "evidence": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"},
                   {"ts": t0 + 20, "event": "remedy", "class": "cuda_oom", "rung": 0,
                    "actions": ["add --gradient_checkpointing"], "delay_s": 1},
                   {"ts": t0 + 30, "event": "attempt_start", "attempt": 2, "resume_from": str(out / "s4"),
                    "resume_step": 4}]
        for s in range(5, steps + 1):
            progress.append({"ts": t0 + 30 + s, "a": 2, "s": s, "t": steps, "l": 0.5 / s, "r": 2.0})
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + extra_lines)
    progress += [{"ts": t0 + 2 * i, "a": 1, "g": [{"i": 0, "u": 900 + 100 * i, "m": 24000, "p": 800}]}
                 for i in range(5)]
    (run_dir / "progress.jsonl").write_text("".join(json.dumps(p) + "\n" for p in progress))
    (run_dir / "status.json").write_text(json.dumps({"state": "finished", "attempt": 2, "step": steps,
                                                      "total": steps, "loss": 0.04, "last_fault": "cuda_oom",
                                                      "updated": t0 + 60}))
    (run_dir / "attempt-1.log").write_text("steps:  10%|#  | 1/12\rsteps:  50%|#####  | 6/12 [\x1b[31mred\x1b[0m]\n"
                                           "torch.OutOfMemoryError: CUDA out of memory.\n")
    (run_dir / "attempt-2.log").write_text("resumed\nsteps: 100%|##########| 8/8\n")
    sample = out / "sample" / "lora_000003_00.png"  # attempt 2's label 3: true step 7
    sample.write_bytes(PNG)
    os.utime(sample, (t0 + 40, t0 + 40))
    return run_dir


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "out"
    run_dir = write_run(out)
    state = tmp_path / "state"
    token, _ = load_token(state)
    env = {"TRAINSUP_PROJECTS": str(tmp_path / "projects"), "HOME": str(tmp_path)}
    store = QueueStore(state)
    catalog = Catalog(env, store, [out])
    app = create_app(catalog, Guard(token, "127.0.0.1", 8470), store, env)
    app.testing = False  # errors take the page's own handler, as when served
    return {"client": app.test_client(), "token": token, "rid": run_id(run_dir.resolve()), "out": out,
            "run_dir": run_dir, "state": state, "tmp": tmp_path, "catalog": catalog, "env": env}


HOST = {"Host": "127.0.0.1:8470"}


def login(site: dict[str, Any]) -> str:
    client = site["client"]
    answer = client.post("/login", data={"token": site["token"], "next": "/"}, headers=HOST)
    assert answer.status_code == 303
    assert COOKIE in answer.headers["Set-Cookie"] and "HttpOnly" in answer.headers["Set-Cookie"]
    assert "SameSite=Strict" in answer.headers["Set-Cookie"]
    page = client.get("/queue", headers=HOST).get_data(as_text=True)
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert csrf, "a logged-in page carries the csrf field"
    return csrf.group(1)


def test_token_is_made_once_owner_only_and_reused(tmp_path: Path) -> None:
    token, path = load_token(tmp_path / "state")
    assert len(token) >= 16
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_token(tmp_path / "state")[0] == token


def test_runs_list_and_run_page_show_the_run(site: dict[str, Any]) -> None:
    client = site["client"]
    listing = client.get("/", headers=HOST).get_data(as_text=True)
    assert f'data-run="{site["rid"]}"' in listing
    assert "12/12" in listing and "cuda_oom" in listing and "add --gradient_checkpointing" in listing
    page = client.get(f"/run/{site['rid']}", headers=HOST)
    text = page.get_data(as_text=True)
    assert page.status_code == 200
    loss = text[text.index('<section id="loss"'):text.index("</section>", text.index('<section id="loss"'))]
    points = int(re.search(r'data-points="(\d+)"', loss).group(1))  # type: ignore[union-attr]
    assert points == 6 + 8  # every step of both attempts (far under the bins)
    assert loss.count('class="series"') == 2 and 'class="boundary"' in loss and 'class="fault"' in loss
    assert re.search(r'data-event="fault".*?cuda_oom', text, re.DOTALL)
    assert re.search(r'data-event="remedy".*?add --gradient_checkpointing', text, re.DOTALL)
    gpu = re.search(r'<section id="gpu".*?data-points="(\d+)"', text, re.DOTALL)
    assert gpu and int(gpu.group(1)) == 5  # GPU memory over time, one point a reading
    assert 'data-step="7"' in text  # attempt 2 resumed at 4 and named its sample with its own step 3
    assert "steps:  50%|#####  | 6/12 [red]" in text  # the bar's last redraw, colour codes dropped
    assert "\x1b" not in text


def _trained_with_block(text: str) -> str | None:
    if '<section id="trained-with"' not in text:
        return None
    start = text.index('<section id="trained-with"')
    return text[start:text.index("</section>", start)]


def test_run_page_says_what_the_weights_were_trained_with(site: dict[str, Any]) -> None:
    client, rid, run_dir = site["client"], site["rid"], site["run_dir"]
    assert _trained_with_block(client.get(f"/run/{rid}", headers=HOST).get_data(as_text=True)) is None  # no end yet
    change = {"change": "add --gradient_checkpointing", "attempt": 2, "from_step": 4, "until_step": None,
              "why": {"class": "cuda_oom", "evidence": "CUDA out of memory <script>alert(1)</script>", "attempt": 1}}
    end = {"ts": 1_790_000_060.0, "event": "finished", "reason": "exit 0", "final_weights": "out/lora.safetensors",
           "attempt": 2, "trained_with": [change]}
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write(json.dumps(end) + "\n")
    block = _trained_with_block(client.get(f"/run/{rid}", headers=HOST).get_data(as_text=True))
    assert block is not None  # from the end record: no trained-with.json
    assert "<code>add --gradient_checkpointing</code> from step 4, for" in block and "cuda_oom" in block
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in block and "<script>" not in block  # escaped
    assert "as of the run's end (finished," in block
    # trained-with.json, written at the same end, is what the page reads when it is there
    (run_dir / "trained-with.json").write_text(json.dumps({
        "end": "finished", "ts": 1_790_000_060.0, "summary": "…",
        "changes": [{**change, "change": "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "from_step": 2,
                     "until_step": 4}, change]}))
    block = _trained_with_block(client.get(f"/run/{rid}", headers=HOST).get_data(as_text=True))
    assert block is not None and block.count('<li class="change">') == 2
    assert "<code>set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True</code> from step 2 until step 4" in block
    # a run trainsup changed nothing in says so
    (run_dir / "trained-with.json").write_text(json.dumps({"end": "finished", "ts": 1_790_000_061.0, "changes": []}))
    block = _trained_with_block(client.get(f"/run/{rid}", headers=HOST).get_data(as_text=True))
    assert block is not None and "The recipe as given: trainsup changed nothing" in block


def test_sample_is_served_and_nothing_outside(site: dict[str, Any]) -> None:
    client, rid, tmp = site["client"], site["rid"], site["tmp"]
    ok = client.get(f"/run/{rid}/file/1/lora_000003_00.png", headers=HOST)
    assert ok.status_code == 200 and ok.mimetype == "image/png" and ok.data == PNG
    secret = tmp / "secret.txt"
    secret.write_text("not for the page")
    (site["out"] / "sample" / "link.png").symlink_to(secret)
    for rel, status in (("1/../../secret.txt", 403), ("1/link.png", 403), ("0/../../secret.txt", 403),
                        ("7/anything.png", 404), ("1/%2e%2e/%2e%2e/secret.txt", 403), ("1/missing.png", 404)):
        answer = client.get(f"/run/{rid}/file/{rel}", headers=HOST)
        assert answer.status_code == status, (rel, answer.status_code)
        assert b"not for the page" not in answer.data
    huge = site["out"] / "sample" / "huge_000001_00.png"
    with open(huge, "wb") as fh:
        fh.truncate(MAX_FILE + 1)  # sparse: no disk spent
    assert client.get(f"/run/{rid}/file/1/huge_000001_00.png", headers=HOST).status_code == 413
    assert client.get(f"/run/{rid}/file/0/events.jsonl", headers=HOST).status_code == 200  # the run dir's own


def test_actions_need_the_token_csrf_and_same_origin(site: dict[str, Any]) -> None:
    client = site["client"]
    project = site["tmp"] / "p.yaml"
    project.write_text(f"command: [python, -c, 'print(1)']\nrun_dir: {site['tmp'] / 'prun'}\n")
    refused = client.post("/queue/add", data={"project": str(project), "csrf": "x"}, headers=HOST)
    assert refused.status_code == 403 and "needs the token" in refused.get_data(as_text=True)
    csrf = login(site)
    assert client.post("/queue/add", data={"project": str(project)}, headers=HOST).status_code == 403
    foreign = client.post("/queue/add", data={"project": str(project), "csrf": csrf},
                          headers={**HOST, "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and "another site" in foreign.get_data(as_text=True)
    assert QueueStore(site["state"]).entries() == []
    done = client.post("/queue/add", data={"project": str(project), "csrf": csrf},
                       headers={**HOST, "Origin": "http://127.0.0.1:8470"})
    assert done.status_code == 303
    entries = QueueStore(site["state"]).entries()
    assert [e.state for e in entries] == ["queued"]
    page = client.get("/queue", headers=HOST).get_data(as_text=True)
    assert f'data-entry="{entries[0].id}"' in page and f"queued as {entries[0].id}" in page


def test_wrong_token_and_foreign_host_are_refused(site: dict[str, Any]) -> None:
    client = site["client"]
    assert client.post("/login", data={"token": "guess"}, headers=HOST).status_code == 403
    assert client.get("/", headers={"Host": "evil.example"}).status_code == 421  # DNS rebinding
    assert client.get("/", headers={"Host": "localhost:8470"}).status_code == 200
    assert client.post("/login", data={"token": site["token"], "next": "//evil.example/"},
                       headers=HOST).headers["Location"] == "/"


def test_beyond_loopback_every_page_needs_the_token(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_run(out)
    token, _ = load_token(tmp_path / "state")
    store = QueueStore(tmp_path / "state")
    app = create_app(Catalog({"TRAINSUP_PROJECTS": str(tmp_path)}, store, [out]),
                     Guard(token, "0.0.0.0", 8470), store, {})
    client = app.test_client()
    there = {"Host": "10.1.2.3:8470"}
    assert client.get("/", headers=there).status_code == 302
    assert client.get("/part/runs", headers=there).status_code == 302
    client.post("/login", data={"token": token}, headers=there)
    assert client.get("/", headers=there).status_code == 200


def test_broken_journal_line_and_missing_run_dir_show_as_such(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_run(out, extra_lines='{"ts": 1, "event": "fault", "class"\nnot json at all\n')
    gone = tmp_path / "gone" / ".trainsup"
    gone.mkdir(parents=True)
    (gone / "status.json").write_text('{"state": "running"')  # cut short
    token, _ = load_token(tmp_path / "state")
    store = QueueStore(tmp_path / "state")
    catalog = Catalog({"TRAINSUP_PROJECTS": str(tmp_path / "p")}, store, [out, gone])
    client = create_app(catalog, Guard(token, "127.0.0.1", 8470), store, {}).test_client()
    page = client.get(f"/run/{run_id((out / '.trainsup').resolve())}", headers=HOST)
    assert page.status_code == 200 and "2 lines of this run" in page.get_data(as_text=True)
    listing = client.get("/", headers=HOST)
    assert listing.status_code == 200 and "is not valid JSON" in listing.get_data(as_text=True)
    rid = run_id(gone.resolve())
    for name in os.listdir(gone):
        (gone / name).unlink()
    gone.rmdir()
    missing = client.get(f"/run/{rid}", headers=HOST)
    assert missing.status_code == 200 and "does not exist" in missing.get_data(as_text=True)
    assert client.get("/run/000000000000", headers=HOST).status_code == 404


def test_reader_takes_only_complete_lines_and_starts_over_on_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "a"}\n{"event": "b"')
    tail = JsonlTail(path)
    assert [r["event"] for r in tail.read_new()[0]] == ["a"]
    with open(path, "a") as fh:
        fh.write('}\n{"event": "c"}\n')
    assert [r["event"] for r in tail.read_new()[0]] == ["b", "c"]
    path.write_text('{"event": "new"}\n')  # replaced, shorter
    records, reset = tail.read_new()
    assert reset and [r["event"] for r in records] == ["new"]


def test_a_long_curve_is_downsampled_and_keeps_its_spike() -> None:
    steps = list(range(300_000))
    losses: list[float | None] = [1.0] * len(steps)
    losses[123_456] = 50.0
    bins = plots.downsample(steps, losses, 0, steps[-1])
    assert len(bins) == plots.BINS
    assert max(b.high for b in bins) == 50.0
    svg = plots.line_chart([("attempt 1", bins)], [], "step", "loss")
    assert f'data-points="{plots.BINS}"' in svg


def test_progress_log_writes_a_point_per_step_and_gpu_readings(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    log = ProgressLog()
    journal.listen(log)
    for step, ts_gpu in ((1, None), (1, None), (2, [{"index": 0, "used_mib": 900, "total_mib": 24000}])):
        journal.status(state="running", attempt=1, step=step, total=10, loss=0.5, rate=1.0,
                       **({"gpu": ts_gpu} if ts_gpu else {}))
    journal.status(state="finished", step=10)
    log.close()
    journal.close()
    records = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [r.get("s") for r in records if "s" in r] == [1, 2]
    assert [r["g"][0]["u"] for r in records if "g" in r] == [900]


def test_a_run_without_faults_draws_one_series(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_dir = write_run(out, fault_at=None)
    token, _ = load_token(tmp_path / "state")
    store = QueueStore(tmp_path / "state")
    client = create_app(Catalog({"TRAINSUP_PROJECTS": str(tmp_path / "p")}, store, [out]),
                        Guard(token, "127.0.0.1", 8470), store, {}).test_client()
    page = client.get(f"/run/{run_id(run_dir.resolve())}", headers=HOST).get_data(as_text=True)
    loss = page[page.index('<section id="loss"'):]
    assert 'data-points="12"' in loss and loss.count('class="series"') >= 1 and 'class="fault"' not in loss


def test_queue_edits_from_the_page_are_the_queue_commands(site: dict[str, Any]) -> None:
    client, tmp = site["client"], site["tmp"]
    csrf = login(site)
    for name in ("a", "b"):
        (tmp / f"{name}.yaml").write_text(f"command: [python, -c, 'print(1)']\nrun_dir: {tmp / ('run-' + name)}\n")
        assert client.post("/queue/add", data={"project": str(tmp / f"{name}.yaml"), "csrf": csrf},
                           headers=HOST).status_code == 303
    store = QueueStore(site["state"])
    assert client.post("/queue/q2/move", data={"to": "1", "csrf": csrf}, headers=HOST).status_code == 303
    assert [e.id for e in sorted(store.entries(), key=lambda e: e.position)] == ["q2", "q1"]
    assert client.post("/queue/pause", data={"csrf": csrf}, headers=HOST).status_code == 303
    assert store.paused()
    assert client.post("/queue/resume", data={"csrf": csrf}, headers=HOST).status_code == 303
    assert not store.paused()
    assert client.post("/queue/q1/stop", data={"csrf": csrf}, headers=HOST).status_code == 303
    assert store.get("q1").state == "stopped"  # a queued entry stops at once: it will not start
    assert client.post("/queue/q1/remove", data={"csrf": csrf}, headers=HOST).status_code == 303
    assert [e.id for e in store.entries()] == ["q2"]
    assert client.post("/queue/remove", data={"csrf": csrf}, headers=HOST).status_code == 404  # names no entry
    page = client.get("/queue", headers=HOST).get_data(as_text=True)
    assert 'data-entry="q2"' in page and 'data-entry="q1"' not in page


def test_true_named_samples_show_at_their_step_and_a_relaunch_on_the_timeline(site: dict[str, Any]) -> None:
    """sd-scripts runs since issue 29: the samples record says the names are true steps (an attempt's
    own names, before trainsup publishes them, do not match and are placed by time), and a planned
    relaunch at an epoch's end is on the timeline with its reason."""
    run_dir, out, t0 = site["run_dir"], site["out"], 1_790_000_000.0
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    events[0]["samples"] = {"dirs": [str(out / "sample")], "absolute_steps": True,
                            "step_pattern": r"^lora_(\d{6})_\d{2}(?:_\d{14})?(?:_\d+)?\.png$"}
    events.append({"ts": t0 + 36, "event": "segment_relaunch", "step": 8, "attempt": 2,
                   "why": "one cadence from step 4 to 12 would write 8 step saves for 2"})
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (out / "sample" / "lora_000003_00.png").unlink()
    for name, when in (("lora_000008_00_20261126120000_1.png", t0 + 35), ("lora-trainsup2_000001_00.png", t0 + 39)):
        (out / "sample" / name).write_bytes(PNG)
        os.utime(out / "sample" / name, (when, when))
    text = site["client"].get(f"/run/{site['rid']}", headers=HOST).get_data(as_text=True)
    assert 'data-step="8"' in text  # its name's step, nothing added
    assert 'data-step="9"' in text  # an attempt's own name: the step the run had reached at its time
    assert re.search(r'data-event="segment_relaunch".*?step 8.*?8 step saves for 2', text, re.DOTALL)


def test_a_planned_stop_reads_as_trainsup_s_not_as_a_signal() -> None:
    """A finished run's last attempt, stopped by trainsup once the last step was saved, never reads
    `ended: signal 15` on the timeline; a trainer killed by a signal still does."""
    from trainsup.web.runs import _words

    planned, _ = _words("attempt_end", {"attempt": 2, "signal": 15, "step": 60, "planned_stop": "run_complete"})
    assert planned == "attempt 2 ended: stopped by trainsup once the last step was saved, at step 60"
    killed, _ = _words("attempt_end", {"attempt": 1, "signal": 9, "step": 12, "planned_stop": None})
    assert killed == "attempt 1 ended: signal 9, at step 12"


def test_a_live_run_of_several_ranks_shows_them_on_its_page_row() -> None:
    from trainsup.commands.runref import RunRef
    from trainsup.commands.status import RunView
    from trainsup.web.runs import KnownRun, Row

    ranks = [{"rank": 1, "pid": 4324}, {"rank": 0, "pid": 4323}]
    view = RunView("tiny", "running", "/out/.trainsup", attempt=1, step=60, total=200, ranks=ranks)
    run = KnownRun("r1", RunRef("tiny", Path("/out/.trainsup")))
    assert Row(run, view, None, True).ranks_text == "ranks 0, 1 (pids 4323, 4324)"
    assert Row(run, view, None, False).ranks_text is None  # ended: its processes are gone
    one = RunView("tiny", "running", "/out/.trainsup", ranks=[{"rank": None, "pid": 12}])
    assert Row(run, one, None, True).ranks_text is None  # a one-process launcher's trainer: nothing to say
