"""Notifications and metrics: the policy sections, what a message says, the rate limit, sending through
apprise to a real HTTP receiver on loopback, journal listeners, the folding of a run's journal into
metric values, and their export (a real scrape, the textfile parsed back with prometheus_client's
own parser, samples of several runs merged)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until
from trainsup.record.journal import Journal, read_events
from trainsup.run.policy import MetricsPolicy, NotifyPolicy, Policy, PolicyError, parse_policy
from trainsup.run.project import parse_project
from trainsup.service.alerts import Alerts, RunAlerts, expand_env
from trainsup.service.metrics import (
    MetricsListener,
    RunDirMetrics,
    RunMetrics,
    TextfileWriter,
    registry_for,
    start_listener,
)
from trainsup.service.notices import RateLimit, RunStory, log_tail
from trainsup.service.reporting import listeners_for

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.68 GiB"


class Receiver:
    """A webhook on loopback (http.server in a thread) that keeps the JSON body of every POST;
    ``delay_s`` makes it slow to answer."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(delay_s)
                outer.bodies.append(json.loads(data))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"json://127.0.0.1:{self.server.server_port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="test-receiver")
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def receiver() -> Any:
    r = Receiver()
    yield r
    r.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, parsed by prometheus_client's own parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# --- the policy sections ---------------------------------------------------------------------------
def test_notify_and_metrics_sections_parse_with_defaults_and_file_line_errors() -> None:
    assert Policy().notify == NotifyPolicy(urls=(), on=("finished", "gave_up", "hang"), tail_lines=20)
    assert Policy().metrics == MetricsPolicy(listen=None, textfile=None)
    pol = parse_policy("notify:\n  urls: ['json://h/', 'tgram://${TOKEN}/${CHAT}']\n  on: [fault, remedy]\n"
                       "  tail_lines: 5\n  rate_limit_s: 0\nmetrics:\n  listen: 9464\n  textfile: m.prom\n", "p.yaml")
    assert pol.notify.urls == ("json://h/", "tgram://${TOKEN}/${CHAT}") and pol.notify.on == ("fault", "remedy")
    assert (pol.notify.tail_lines, pol.notify.rate_limit_s) == (5, 0)
    assert pol.metrics == MetricsPolicy("127.0.0.1:9464", "m.prom")  # a bare port is loopback
    for listen, normal in (("0.0.0.0:9100", "0.0.0.0:9100"), ("[::1]:9464", "[::1]:9464"), ("9464", "127.0.0.1:9464")):
        assert parse_policy(f"metrics:\n  listen: '{listen}'\n", "p").metrics.listen == normal
    for text, error in (
            ("notify:\n  on: [finised]\n",
             r"p.yaml:2: notify.on: expected a list of finished \| gave_up .*not 'finised'"),
            ("notify:\n  on: finished\n", r"p.yaml:2: notify.on: expected a list of"),
            ("notify:\n  urls: json://h/\n", r"p.yaml:2: notify.urls: expected a list of apprise URLs"),
            ("notify:\n  urls: ['x://${A B}']\n", r"notify.urls: .*not 'A B'"),
            ("notify:\n\n  tail_lines: -1\n", r"p.yaml:3: notify.tail_lines: expected an integer >= 0"),
            ("notify:\n  to: []\n", r"p.yaml:2: notify.to: unknown key; expected one of on, rate_limit_s"),
            ("metrics:\n  listen: 'host:99999'\n", r"p.yaml:2: metrics.listen: expected null, a port or HOST:PORT"),
            ("metrics:\n  listen: ':9464'\n", r"metrics.listen: expected"),
            ("metrics:\n  textfile: m.txt\n", r"p.yaml:2: metrics.textfile: expected null or a path ending in .prom")):
        with pytest.raises(PolicyError, match=error):
            parse_policy(text, "p.yaml")
    project = parse_project("command: python train.py\nnotify:\n  urls: ['json://h/']\n", Path("/p/mylora.yaml"))
    assert project.policy.notify.urls == ("json://h/",)  # project files have the sections too


def test_urls_take_secrets_from_the_environment_and_a_missing_one_leaves_its_url_out() -> None:
    assert expand_env("tgram://${TOKEN}/${CHAT}", {"TOKEN": "123:abc", "CHAT": "42"}) == "tgram://123:abc/42"
    warnings: list[str] = []
    alerts = Alerts(NotifyPolicy(urls=("json://a/${NOPE}", "json://b/")), {}, warn=warnings.append)
    assert alerts.urls == ("json://b/",)
    assert warnings == ["notify.urls[0]: ${NOPE} is not set in the environment; that URL is left out"]
    alerts.close()
    # a section that is off builds nothing: no thread, no port, apprise never imported
    assert listeners_for(Policy()) == []


# --- what a message says ---------------------------------------------------------------------------
def story_of(on: tuple[str, ...], *records: dict[str, Any], run_dir: Path = Path("/srv/out/.trainsup")) -> list[Any]:
    story = RunStory(on)
    notices = story.on_event({"ts": 100.0, "event": "run_start", "run_dir": str(run_dir), "project": "mylora"})
    for record in records:
        if record.get("event") == "_status":
            story.on_status(record)
        else:
            notices += story.on_event(record)
    return notices + story.flush()


OOM_RUN = (
    {"event": "attempt_start", "attempt": 2},
    {"event": "_status", "state": "running", "step": 812, "total": 2000, "loss": 0.0912, "rate": 1.9},
    {"event": "attempt_end", "attempt": 2, "step": 812},
    {"event": "fault", "class": "cuda_oom", "evidence": OOM, "line": 1234, "attempt": 2},
    {"event": "remedy", "class": "cuda_oom", "rung": 1, "actions": ["add --gradient_checkpointing"], "delay_s": 2.0},
)


def test_a_fault_is_told_once_answered_with_evidence_remedy_step_and_eta() -> None:
    (notice,) = story_of(("fault", "remedy"), *OOM_RUN)
    assert notice.kind == "fault" and notice.level == "warning"
    assert notice.title == "mylora: cuda_oom at step 812/2000 — restarting with --gradient_checkpointing"
    lines = notice.body.splitlines()
    assert lines[0] == f"evidence: {OOM} (attempt-2.log line 1234)"
    assert lines[1] == "remedy (rung 1): add --gradient_checkpointing, relaunch in 2 s"
    assert lines[2] == "step 812/2000 · loss 0.0912 · 1.9 it/s · eta 10m25s · attempt 2"
    assert notice.log == Path("/srv/out/.trainsup/attempt-2.log")
    # the default `on` (finished, gave_up, hang) does not tell a remedied fault
    assert story_of(("finished", "gave_up", "hang"), *OOM_RUN) == []
    assert [n.kind for n in story_of(("remedy",), *OOM_RUN)] == ["remedy"]


def test_hang_gave_up_and_finished_messages() -> None:
    hang = ({"event": "attempt_start", "attempt": 1}, {"event": "_status", "step": 40, "total": 100},
            {"event": "hang_stacks", "path": "/r/hang-1.txt"},
            {"event": "fault", "class": "hang", "evidence": "no progress for 300 s at step 40", "attempt": 1},
            {"event": "remedy", "class": "hang", "rung": 0, "actions": ["restart from the last safe state"]})
    (notice,) = story_of(("hang",), *hang)
    assert (notice.kind == "hang"
            and notice.title == "mylora: hang at step 40/100 — restarting from the last saved state")
    assert "evidence: no progress for 300 s at step 40" in notice.body and "stacks: /r/hang-1.txt" in notice.body
    # a fault that ends the run is one message, the end's
    end = (*OOM_RUN[:4], {"event": "gave_up", "reason": "cuda_oom: out of GPU memory after every memory remedy",
                          "exit_code": 4, "attempt": 2})
    (notice,) = story_of(("fault", "gave_up"), *end)
    assert notice.kind == "gave_up" and notice.level == "failure"
    assert notice.title == "mylora: stopped at step 812/2000 — cuda_oom: out of GPU memory after every memory remedy"
    assert notice.body.startswith(f"evidence: {OOM}") and "(exit 4)" in notice.body
    budget = ({"event": "_status", "step": 7, "total": 20},
              {"event": "gave_up", "reason": "restart budget spent: 5 restarts within 3600 s", "exit_code": 3})
    assert story_of(("gave_up",), *budget)[0].title == ("mylora: gave up at step 7/20 — restart budget spent: "
                                                        "5 restarts within 3600 s")
    # a stop by a signal was asked for: not told
    assert story_of(("gave_up",), {"event": "gave_up", "reason": "stopped by SIGTERM", "exit_code": 143}) == []
    done = ({"event": "attempt_start", "attempt": 1}, {"event": "_status", "step": 20, "total": 20, "rate": 3.0},
            {"ts": 160.0, "event": "finished", "reason": "exit 0", "final_weights": "/o/lora.safetensors",
             "attempt": 1})
    (notice,) = story_of(("finished",), *done)
    assert notice.title == "mylora: finished at step 20/20" and notice.level == "success"
    assert notice.body.splitlines()[:3] == ["final weights: /o/lora.safetensors",
                                            "attempts: 1; faults: none; took 1m00s", "step 20/20 · attempt 1"]


def test_the_end_notices_say_what_the_weights_were_trained_with() -> None:
    changed = [{"change": "add --gradient_checkpointing", "why": {"class": "cuda_oom", "evidence": OOM, "attempt": 2},
                "attempt": 3, "from_step": 800, "until_step": None, "environment": False}]
    done = ({"event": "attempt_start", "attempt": 3}, {"event": "_status", "step": 2000, "total": 2000},
            {"ts": 160.0, "event": "finished", "reason": "exit 0", "final_weights": "/o/lora.safetensors",
             "attempt": 3, "trained_with": changed})
    (notice,) = story_of(("finished",), *done)
    assert notice.body.splitlines()[2] == ("trained with: add --gradient_checkpointing from step 800 "
                                           f"(cuda_oom: {OOM[:99]}…)")
    stopped = (*OOM_RUN[:4], {"event": "gave_up", "reason": "cuda_oom: out of GPU memory after every memory remedy",
                              "exit_code": 4, "attempt": 2, "trained_with": changed})
    (notice,) = story_of(("gave_up",), *stopped)
    lines = notice.body.splitlines()
    assert lines[1] == "reason: cuda_oom: out of GPU memory after every memory remedy (exit 4)"
    assert lines[2].startswith("trained with: add --gradient_checkpointing from step 800 (cuda_oom: ")
    as_given = (*done[:2], {**done[2], "trained_with": []})
    assert "trained with the recipe as given (no remedy)" in story_of(("finished",), *as_given)[0].body.splitlines()


def test_the_log_tail_is_what_a_terminal_shows(tmp_path: Path) -> None:
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"old line\n" * 50 + b"steps:  10%|#  | 2/20\rsteps:  15%|## | 3/20 loss=0.3\n"
                    b"\x1b[31mTraceback (most recent call last):\x1b[0m\n" + OOM.encode() + b"\n\n")
    assert log_tail(log, 3) == ["steps:  15%|## | 3/20 loss=0.3", "Traceback (most recent call last):", OOM]
    assert log_tail(log, 0) == [] and log_tail(tmp_path / "none.log", 5) == []


def test_the_same_fault_is_rate_limited_and_the_next_message_counts_what_was_held(receiver: Receiver) -> None:
    now = [0.0]
    limit = RateLimit(600, clock=lambda: now[0])
    assert limit.admit("a") == 0 and limit.admit("a") is None and limit.admit("b") == 0
    now[0] = 601
    assert limit.admit("a") == 1  # one held back
    alerts = Alerts(NotifyPolicy(urls=(receiver.url,), on=("fault",), tail_lines=0), {}, clock=lambda: now[0])
    (notice,) = story_of(("fault",), *OOM_RUN)
    assert alerts.tell(notice) is True and alerts.tell(notice) is False and alerts.tell(notice) is False
    now[0] += 601
    assert alerts.tell(notice) is True
    alerts.close()
    assert [b["title"] for b in receiver.bodies] == [notice.title] * 2
    assert receiver.bodies[1]["message"].endswith("2 more of the same since the last notification (told at most "
                                                  "once per 10m00s)")


# --- sending: real apprise, a real receiver --------------------------------------------------------
def test_a_run_is_told_through_apprise_and_a_failed_send_is_journaled_never_fatal(
        tmp_path: Path, receiver: Receiver) -> None:
    (tmp_path / "attempt-1.log").write_text("loading\nsteps: 5/20\nmodel saved.\n")
    policy = NotifyPolicy(urls=(receiver.url, f"json://127.0.0.1:{free_port()}/"), on=("finished",), tail_lines=2)
    journal = Journal(tmp_path)
    journal.listen(RunAlerts(policy, {}))
    listener = journal._listeners[0]
    journal.event("run_start", run_dir=str(tmp_path), project="mylora")
    journal.event("attempt_start", attempt=1)
    journal.status(state="finished", step=20, total=20)
    started = time.monotonic()
    journal.event("finished", reason="exit 0", final_weights="out/lora.safetensors", attempt=1)
    assert time.monotonic() - started < 0.05  # the loop only enqueues
    listener.close()
    journal.close()
    (body,) = receiver.bodies
    assert body["title"] == "mylora: finished at step 20/20" and body["type"] == "success"
    assert body["message"].endswith("last 2 lines of attempt-1.log:\nsteps: 5/20\nmodel saved.")
    (failed,) = [e for e in read_events(tmp_path) if e["event"] == "notify_failed"]
    assert failed["kind"] == "finished" and failed["url"].startswith("json://127.0.0.1:")
    assert "error" in failed["error"].lower() or "connect" in failed["error"].lower()


def test_a_slow_receiver_never_holds_the_loop_up_and_times_out(tmp_path: Path) -> None:
    slow = Receiver(delay_s=2.0)
    try:
        failures: list[dict[str, Any]] = []
        alerts = Alerts(NotifyPolicy(urls=(slow.url,), timeout_s=1), {}, report=failures.append, warn=lambda m: None)
        started = time.monotonic()
        assert alerts.send("queue empty", "nothing left to train")  # the daemon's own message
        assert time.monotonic() - started < 0.05
        wait_until(lambda: failures, timeout=10, what="the read timeout")
        alerts.close()
        assert failures[0]["kind"] == "queue_empty" and failures[0]["title"] == "queue empty"
    finally:
        slow.close()


# --- journal listeners -----------------------------------------------------------------------------
class Recorder:
    def __init__(self, journal: Journal | None = None, fail_on: str | None = None) -> None:
        self.events: list[str] = []
        self.journal, self.fail_on = journal, fail_on

    def on_event(self, record: dict[str, Any]) -> None:
        if record["event"] == self.fail_on:
            raise RuntimeError("boom")
        self.events.append(record["event"])
        if self.journal is not None:
            self.journal.event("echo")  # journaling from a listener: written, not passed on again

    def on_status(self, snapshot: dict[str, Any]) -> None:
        self.events.append(f"status:{snapshot['step']}")

    def close(self) -> None:
        pass


def test_a_listener_hears_after_the_write_and_one_that_raises_is_dropped_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = Journal(tmp_path)
    good, bad = Recorder(journal), Recorder(fail_on="b")
    journal.listen(bad)
    journal.listen(good)
    journal.event("a")
    journal.status(step=3)
    journal.event("b")
    journal.event("c")
    journal.close()
    journal.event("late")  # after close: dropped, not an error
    assert good.events == ["a", "status:3", "b", "c"] and bad.events == ["a", "status:3"]
    assert [e["event"] for e in read_events(tmp_path)] == ["a", "echo", "b", "echo", "c", "echo"]
    err = capsys.readouterr().err.splitlines()
    assert err == ["trainsup: warning: Recorder failed and is turned off (RuntimeError: boom); supervision goes on"]


# --- metrics ---------------------------------------------------------------------------------------
RUN_EVENTS: list[dict[str, Any]] = [
    {"event": "attempt_end", "supervisor_lost": True},  # a dead supervisor's: before the run_start
    {"event": "run_start", "project": "mylora", "run_dir": "/r"},
    {"event": "attempt_start", "attempt": 1},
    {"event": "fault", "class": "cuda_oom"},
    {"event": "remedy", "class": "cuda_oom", "rung": 0},
    {"event": "attempt_start", "attempt": 2},
    {"event": "fault", "class": "hang"},
    {"event": "remedy", "class": "hang", "rung": 0},
    {"event": "attempt_start", "attempt": 3},
]
STATUS = {"state": "running", "step": 812, "total": 2000, "loss": None, "rate": 2.0,
          "gpu": [{"index": 0, "used_mib": 18000, "trainer_mib": 16000, "total_mib": 24576},
                  {"index": 1, "used_mib": None, "trainer_mib": None, "total_mib": 24576}]}


def folded() -> RunMetrics:
    metrics = RunMetrics()
    for record in RUN_EVENTS:
        metrics.apply_event(record)
    metrics.apply_status(STATUS)
    return metrics


def test_run_metrics_fold_the_journal_into_prometheus_values() -> None:
    values = scrape(generate_latest(registry_for(lambda: [folded()])).decode())
    p = (("project", "mylora"),)
    assert values[("trainsup_run_step", p)] == 812 and values[("trainsup_run_total_steps", p)] == 2000
    assert values[("trainsup_run_steps_per_second", p)] == 2.0 and values[("trainsup_run_eta_seconds", p)] == 594
    assert ("trainsup_run_loss", p) not in values  # unknown (NaN) is no sample, never 0
    states = {dict(k[1])["state"]: v for k, v in values.items() if k[0] == "trainsup_run_state"}
    assert states == {"starting": 0, "running": 1, "stopping": 0, "remedying": 0, "backoff": 0, "finished": 0,
                      "gave_up": 0, "stopped": 0}
    assert values[("trainsup_attempts_total", p)] == 3 and values[("trainsup_hangs_total", p)] == 1
    assert values[("trainsup_faults_total", (("class", "cuda_oom"), *p))] == 1
    assert values[("trainsup_remedies_total", (("class", "hang"), *p, ("rung", "0")))] == 1
    assert values[("trainsup_gpu_memory_used_bytes", (("gpu", "0"), *p))] == 18000 * 1024 * 1024
    assert values[("trainsup_gpu_memory_trainer_bytes", (("gpu", "0"), *p))] == 16000 * 1024 * 1024
    assert ("trainsup_gpu_memory_used_bytes", (("gpu", "1"), *p)) not in values
    after = folded()
    after.apply_status({**STATUS, "state": "finished"})  # speed and ETA only while it runs
    values = scrape(generate_latest(registry_for(lambda: [after])).decode())
    assert ("trainsup_run_steps_per_second", p) not in values and ("trainsup_run_eta_seconds", p) not in values


def test_the_collector_merges_runs_and_extra_families_under_one_help_and_type() -> None:
    other = RunMetrics("sdxl")
    other.apply_status({"state": "finished", "step": 3000, "total": 3000})

    def queue_entries() -> list[Any]:
        family = GaugeMetricFamily("trainsup_queue_entries", "Queue entries by state.", labels=["state"])
        family.add_metric(["queued"], 2)
        return [family]

    text = generate_latest(registry_for(lambda: [folded(), other], queue_entries)).decode()
    assert text.count("# TYPE trainsup_run_step gauge") == 1 and text.count("# HELP trainsup_faults_total") == 1
    values = scrape(text)
    assert values[("trainsup_run_step", (("project", "mylora"),))] == 812
    assert values[("trainsup_run_step", (("project", "sdxl"),))] == 3000
    assert values[("trainsup_run_state", (("project", "sdxl"), ("state", "finished")))] == 1
    assert values[("trainsup_queue_entries", (("state", "queued"),))] == 2


def test_the_textfile_is_valid_after_every_write_and_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "mylora.prom"
    metrics = folded()
    writer = TextfileWriter(path, registry_for(lambda: [metrics]), interval_s=0.05)
    for step in (1, 2, 3):
        metrics.apply_status({**STATUS, "step": step})
        writer.touch()
        wait_until(lambda step=step: path.exists()
                   and scrape(path.read_text())[("trainsup_run_step", (("project", "mylora"),))] == step,
                   timeout=5, what=f"step {step} in the textfile")
    metrics.apply_status({**STATUS, "state": "finished", "step": 2000})
    writer.close()  # the final write, whatever the throttle
    values = scrape(path.read_text())
    assert values[("trainsup_run_state", (("project", "mylora"), ("state", "finished")))] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["mylora.prom"]  # no temporary file left behind


def test_run_dir_metrics_read_the_journal_incrementally(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    lines = [json.dumps(e) for e in RUN_EVENTS]
    events.write_text("\n".join(lines[:4]) + "\n" + lines[4][:10])  # the last line still being written
    (tmp_path / "status.json").write_text(json.dumps(STATUS))
    reader = RunDirMetrics(tmp_path, project="flux-lora")
    first = reader.collect()
    assert (first.project, first.attempts, first.faults, first.remedies) == ("flux-lora", 1, {"cuda_oom": 1}, {})
    events.write_text("\n".join(lines) + "\n")
    second = reader.collect()
    assert (second.attempts, second.hangs, second.remedies) == (3, 1, {("cuda_oom", "0"): 1, ("hang", "0"): 1})
    assert reader.offset == events.stat().st_size and second.step == 812
    events.write_text(json.dumps(RUN_EVENTS[1]) + "\n")  # a new journal: folded from its start
    assert reader.collect().attempts == 0
    unnamed = tmp_path / "out" / ".trainsup"
    unnamed.mkdir(parents=True)
    assert RunDirMetrics(unnamed).collect().project == "out"  # no project anywhere: the output dir's name


def test_the_endpoint_serves_scrapes_and_a_port_in_use_is_one_warning(tmp_path: Path) -> None:
    port = free_port()
    listener = MetricsListener(MetricsPolicy(listen=f"127.0.0.1:{port}", textfile="m.prom"))
    for record in RUN_EVENTS:
        listener.on_event({**record, "run_dir": str(tmp_path)} if record["event"] == "run_start" else record)
    listener.on_status(STATUS)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert scrape(response.read().decode())[("trainsup_run_step", (("project", "mylora"),))] == 812
    warnings: list[str] = []
    second = MetricsListener(MetricsPolicy(listen=f"127.0.0.1:{port}"), warn=warnings.append)
    second.on_event({"event": "run_start", "project": "other"})
    assert second.endpoint is None
    assert warnings == [(f"metrics.listen 127.0.0.1:{port}: cannot listen (Address already in use); "
                         "the run goes on without the endpoint")]
    second.close()
    listener.close()  # the port is free again and the server's thread has ended
    endpoint = start_listener(f"127.0.0.1:{port}", registry_for(list))
    endpoint.close()
    assert scrape((tmp_path / "m.prom").read_text())[("trainsup_attempts_total", (("project", "mylora"),))] == 3


def test_a_journal_record_cut_short_is_left_out_not_a_crash(tmp_path: Path) -> None:
    """A reader may see half of the record being written, and a supervisor killed mid-write leaves
    one behind that later records follow: both are left out, every whole record is read."""
    whole = ['{"event": "run_start"}', '{"event": "attempt_start", "attempt": 1}']
    (tmp_path / "events.jsonl").write_text(whole[0] + '\n{"event": "attempt_end", "argv": ["/venv/bi\n'
                                           + whole[1] + '\n{"event": "state_saved", "dir": "/out/ti',
                                           encoding="utf-8")
    assert [e["event"] for e in read_events(tmp_path)] == ["run_start", "attempt_start"]
