"""Notifications and metrics of real demo runs under `trainsup run`: apprise's json:// notifications
reach a webhook on loopback, the /metrics endpoint is scraped while the run trains (parsed with
prometheus_client's own parser), and the node_exporter textfile is read back throughout."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.demo_harness import FAST_POLICY, clean_env, demo_argv, supervise
from tests.unit.test_alerts_metrics import Receiver, free_port, scrape

LORA = (("project", "lora"),)


class Watcher:
    """Scrapes the endpoint and reads the textfile every 0.1 s while the run goes on."""

    def __init__(self, port: int, textfile: Path) -> None:
        self.port, self.textfile = port, textfile
        self.scrapes: list[dict[Any, float]] = []
        self.textfile_reads = 0
        self.invalid: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-scraper")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as response:
                    self.scrapes.append(scrape(response.read().decode()))
            except OSError:
                pass  # not listening yet, or any more
            try:
                text = self.textfile.read_text()
            except FileNotFoundError:
                continue
            self.textfile_reads += 1
            try:  # every read finds a whole file: it is only ever replaced, never written in place
                names = {f.name for f in text_string_to_metric_families(text)}
                assert "trainsup_run_step" in names and "trainsup_run_state" in names
            except Exception as exc:  # noqa: BLE001 - any parse failure is the finding
                self.invalid.append(f"{exc}: {text[:200]!r}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_a_demo_run_tells_its_faults_and_its_finish_and_serves_metrics_while_it_trains(
        assets: dict[str, Path], tmp_path: Path) -> None:
    out, prom, port = tmp_path / "out", tmp_path / "lora.prom", free_port()
    receiver = Receiver()
    policy = (FAST_POLICY + f"notify:\n  urls: ['{receiver.url}']\n  on: [fault, remedy, finished]\n"
              f"  tail_lines: 5\nmetrics:\n  listen: '127.0.0.1:{port}'\n  textfile: {prom}\n")
    watcher = Watcher(port, prom)
    try:
        run = supervise(demo_argv("train_network", assets, out, steps=20), out, tmp_path, policy=policy,
                        env=clean_env(TRAINSUP_DEMO_SIMULATE="cuda_oom@5", TRAINSUP_DEMO_STEP_SECONDS="0.1"))
    finally:
        watcher.stop()
        receiver.close()
    assert run.returncode == 0, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and not run.of("notify_failed")

    # two OOMs (the second after the first rung), each told once with what was done; then the finish
    first, second, done = receiver.bodies
    assert re.fullmatch(r"lora: cuda_oom at step \d+/20 — restarting with "
                        r"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", first["title"]), first["title"]
    assert re.fullmatch(r"lora: cuda_oom at step \d+/20 — restarting with --gradient_checkpointing",
                        second["title"]), second["title"]
    assert first["type"] == second["type"] == "warning"
    lines = first["message"].splitlines()
    assert re.fullmatch(r"evidence: .*CUDA out of memory\. Tried to allocate 2\.00 GiB.* "
                        r"\(attempt-1\.log line \d+\)", lines[0]), lines[0]
    assert lines[1].startswith("remedy (rung 0): set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert re.match(r"step \d+/20 · loss \S+ · \S+ it/s · eta \d\S* · attempt 1$", lines[2]), lines[2]
    tail = first["message"].split("last 5 lines of attempt-1.log:\n", 1)[1].splitlines()
    assert len(tail) == 5 and any("CUDA out of memory" in line for line in tail)
    assert "remedy (rung 1): add --gradient_checkpointing" in second["message"]
    assert done["title"] == "lora: finished at step 20/20" and done["type"] == "success"
    assert "attempts: 3; faults: cuda_oom x2" in done["message"] and "last 5 lines of attempt-3.log" in done["message"]

    # what the final weights were trained with: both remedies, from the step each attempt resumed at
    alloc, checkpointing = json.loads((run.run_dir / "trained-with.json").read_text())["changes"]
    starts = run.of("attempt_start")
    assert (alloc["change"], alloc["attempt"], alloc["from_step"], alloc["until_step"]) == (
        "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", 2, starts[1]["resume_step"], None)
    assert (checkpointing["change"], checkpointing["attempt"], checkpointing["from_step"]) == (
        "add --gradient_checkpointing", 3, starts[2]["resume_step"])
    assert [c["why"]["class"] for c in (alloc, checkpointing)] == ["cuda_oom"] * 2
    assert "CUDA out of memory" in alloc["why"]["evidence"]
    line = next(x for x in run.stderr.splitlines() if x.startswith("trainsup: trained with:"))
    assert re.fullmatch(r"trainsup: trained with: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True from step "
                        r"\d+ \(cuda_oom: .*CUDA out of memory.*\); add --gradient_checkpointing from step \d+ "
                        r"\(cuda_oom(: .*)?\)", line), line
    assert line.removeprefix("trainsup: ") in done["message"].splitlines()

    # the endpoint was scraped while the run trained, and its step moved
    steps = [s[("trainsup_run_step", LORA)] for s in watcher.scrapes if ("trainsup_run_step", LORA) in s]
    assert len(set(steps)) >= 3 and max(steps) > 0, steps
    assert any(s.get(("trainsup_run_state", (*LORA, ("state", "running")))) == 1 for s in watcher.scrapes)
    assert any(s.get(("trainsup_faults_total", (("class", "cuda_oom"), *LORA))) == 1 for s in watcher.scrapes)

    # the textfile was whole at every read, and its last write is the run's end
    assert watcher.textfile_reads >= 5 and watcher.invalid == []
    final = scrape(prom.read_text())
    assert final[("trainsup_run_state", (*LORA, ("state", "finished")))] == 1
    assert final[("trainsup_run_step", LORA)] == 20 and final[("trainsup_attempts_total", LORA)] == 3
    assert final[("trainsup_faults_total", (("class", "cuda_oom"), *LORA))] == 2
    assert final[("trainsup_remedies_total", (("class", "cuda_oom"), *LORA, ("rung", "1")))] == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("lora.prom")] == ["lora.prom"]


def test_a_run_that_notifies_on_finished_posts_once_when_it_finishes(assets: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    receiver = Receiver()
    try:
        run = supervise(demo_argv("train_network", assets, out, steps=4, save_every=2), out, tmp_path,
                        policy=FAST_POLICY + f"notify: {{urls: ['{receiver.url}'], on: [finished]}}\n")
    finally:
        receiver.close()
    assert run.returncode == 0, run.stderr[-2000:]
    (body,) = receiver.bodies
    assert body["title"] == "lora: finished at step 4/4" and body["type"] == "success"
    assert "final weights: " in body["message"] and "attempts: 1; faults: none" in body["message"]
