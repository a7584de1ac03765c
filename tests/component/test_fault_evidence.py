"""`trainsup run` shows what ended an attempt (issue 35): an unknown exception by its line, on the
console, in the journal's ``fault`` record (which the notifications and the page read) and in
``status.json`` (``trainsup status``); a harmless warning printed first never outranks it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_trainsup
from trainsup.commands.status import RunView, format_line
from trainsup.service.notices import RunStory
from trainsup.service.queuestore import QueueStore
from trainsup.web.app import create_app
from trainsup.web.auth import Guard, load_token
from trainsup.web.runs import Catalog, timeline

BNB = ("Failed to load CPU gemm_4bit_forward from kernels-community: No module named 'kernels'. Please make sure "
       "you already `pip install kernels` and the kernels >= 0.11.1")
ODD = "RuntimeError: something odd happened in my custom trainer"
MISMATCH = ("size mismatch for lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight: copying a param with "
            "shape torch.Size([8, 320]) from checkpoint, the shape in current model is torch.Size([4, 320]).")
CHILD = """import sys
print({bnb!r}, file=sys.stderr, flush=True)
print("INFO     loading network weights from out/tiny-state", flush=True)
if sys.argv[1] == "odd":
    raise RuntimeError("something odd happened in my custom trainer")
raise RuntimeError("Error(s) in loading state_dict for LoRANetwork:\\n\\t" + {mismatch!r})
"""


def _run(tmp_path: Path, mode: str) -> tuple[int, str, list[dict[str, object]], dict[str, object]]:
    child = tmp_path / "train_custom.py"
    child.write_text(CHILD.format(bnb=BNB, mismatch=MISMATCH))
    pol = tmp_path / "policy.yaml"
    pol.write_text("restart:\n  max: 0\n  min_uptime_s: 0\nbackoff:\n  initial_s: 0\n")
    run_dir = tmp_path / "run"
    r = run_trainsup(["run", "--policy", str(pol), "--run-dir", str(run_dir), "--", sys.executable, str(child), mode],
                     cwd=tmp_path)
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    status = json.loads((run_dir / "status.json").read_text())
    return r.returncode, r.stderr, events, status


@pytest.mark.parametrize(("mode", "fault", "line", "code"), [
    ("odd", "unknown", ODD, 3),  # restarted (here the budget is 0: it gives up)
    ("mismatch", "config_error", "\t" + MISMATCH, 4),  # a restart cannot load it: stop at once
])
def test_the_line_that_ended_the_attempt_is_shown_everywhere(tmp_path: Path, mode: str, fault: str, line: str,
                                                            code: int) -> None:
    rc, stderr, events, status = _run(tmp_path, mode)
    assert rc == code, stderr
    faults = [e for e in events if e["event"] == "fault"]
    assert [(e["class"], e["evidence"]) for e in faults] == [(fault, line)]  # never the warning on line 1
    said = [x for x in stderr.splitlines() if fault in x and line.strip()[:80] in x]  # the console, however worded
    assert said, stderr
    assert (status["last_fault"], status["last_fault_evidence"]) == (fault, line.strip())
    story = RunStory(["fault", "remedy", "gave_up"])  # the notifications read the journal
    told = [n for e in events for n in story.on_event(e)]
    assert told and all(f"evidence: {line[:80]}" in n.body for n in told), [n.body for n in told]  # clipped
    shown = [item for item in timeline(events) if item.kind == "fault"]  # the run's page
    assert [(item.text, item.detail) for item in shown] == [(f"fault: {fault}", line)]


def test_the_runs_page_shows_an_unknown_fault_by_its_line(tmp_path: Path) -> None:
    assert _run(tmp_path, "odd")[0] == 3
    env = {"TRAINSUP_PROJECTS": str(tmp_path / "projects"), "HOME": str(tmp_path)}
    store = QueueStore(tmp_path / "state")
    app = create_app(Catalog(env, store, [tmp_path / "run"]), Guard(load_token(tmp_path / "state")[0], "127.0.0.1",
                                                                     8470), store, env)
    listing = app.test_client().get("/", headers={"Host": "127.0.0.1:8470"}).get_data(as_text=True)
    assert ">unknown</b>" in listing and f'<span class="detail">{ODD}</span>' in listing


def test_status_shows_an_unknown_fault_by_its_line() -> None:
    run = RunView("tiny", "gave_up", "/r", attempt=1, last_fault="unknown", last_fault_evidence=ODD, exit_code=3)
    assert f"fault unknown ({ODD})" in format_line(run)
    named = RunView("tiny", "gave_up", "/r", attempt=1, last_fault="cuda_oom", last_fault_evidence="OOM", exit_code=3)
    assert "fault cuda_oom " in format_line(named) + " " and "(OOM)" not in format_line(named)
