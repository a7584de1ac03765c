"""`trainsup run` over two real ranks: TRL's ``sft.py`` (transformers' Trainer) under ``torchrun
--nproc_per_node 2`` with the gloo backend, on the CPU, as the issue's bed notes run it. A rank killed -9
mid-run: the whole tree stopped within seconds (measured), the rank journaled, resumed, ended as an
uninterrupted two-rank run to the bit. A rank stopped (SIGSTOP): a hang at the hang timeout whose report
names it as the straggler, every rank's stacks in the run dir, resumed, ended the same.

A two-rank run is ~20 s, nearly all of it start-up (the 200 steps take ~4 s). OMP_NUM_THREADS=1: two
ranks on two cores."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import bare_ranks_run
from tests.e2e.demo_harness import SupervisedRun, supervise, visible_names
from tests.real_hf.bed import HfBed, processes_of

# --use_cpu true: without it transformers initialises the process group but trains each rank on its own
# ("parallel_mode != ParallelMode.DISTRIBUTED"; seen: rank 0 trained on, ~95 steps a second, while rank 1 was
# stopped); with it the ranks are DDP's and synchronise their gradients every step (~27 steps a second, rank 0
# waits for a stopped rank 1). The run is 200 steps with a checkpoint every 50 for a kill or a stop to land
# inside it. 64 examples, batch 8 on each of 2
# ranks: 4 steps an epoch; the loss dict of a step prints its epoch.
STEPS, SAVE_EVERY = 200, 50
STEP_120 = "'epoch': '30'"
STEP_60 = "'epoch': '15'"


def command(bed: HfBed, out: Path) -> list[str]:
    r = bed.root
    sft = next((r / "venv" / "lib").glob("python3*/site-packages/trl/scripts/sft.py"))
    return [str(r / "venv" / "bin" / "torchrun"), "--nproc_per_node", "2", str(sft),
            "--model_name_or_path", str(r / "model" / "tiny-llama"), "--dataset_name", str(r / "data" / "chat"),
            "--output_dir", str(out), "--max_steps", str(STEPS), "--save_steps", str(SAVE_EVERY),
            "--logging_steps", "1", "--per_device_train_batch_size", "8", "--bf16", "false", "--ddp_backend", "gloo",
            "--use_cpu", "true"]


def env(bed: HfBed) -> dict[str, str]:
    return bed.env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def reference(hf_bed: HfBed, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("ranks-reference")
    out = cwd / "out"
    # the final model's folder is written last, ending with training_args.bin
    code, stderr = bare_ranks_run(command(hf_bed, out), cwd, env(hf_bed),
                                  lambda: (out / "training_args.bin").is_file())
    assert code == 0, stderr[-3000:]
    return out


def assert_as_uninterrupted(bed: HfBed, out: Path, reference: Path) -> None:
    assert visible_names(out) == visible_names(reference)
    last = out / f"checkpoint-{STEPS}"
    assert json.loads((last / "trainer_state.json").read_text())["global_step"] == STEPS
    for rel in ("model.safetensors", f"checkpoint-{STEPS}/model.safetensors"):
        assert bed.max_abs_diff(out / rel, reference / rel) == 0.0, rel
    assert not processes_of(out), "a process still names the output dir"


class AtStep(threading.Thread):
    """Once attempt 1's log shows ``marker`` (a step's loss dict) and the journal its two ranks: ``act`` on
    rank 1's process; then time how long until no process of the attempt is left."""

    def __init__(self, out: Path, act: int, marker: str) -> None:
        super().__init__(daemon=True)
        self.out, self.act, self.marker = out, act, marker
        self.pid: int | None = None
        self.at: float | None = None
        self.at_wall: float | None = None  # the journal's clock, for the time from the act to an event of it
        self.stopped_after: float | None = None

    def assert_kill_stopped_the_tree(self, run: SupervisedRun, who: str, trainer: str) -> None:
        """The kill's run finished, every other process of the attempt gone within 5 s of the kill (printed),
        the trainer's two ranks journaled, and rank 1's end among the first attempt's (rank 0's too when its
        launcher tore it down before trainsup looked, on a loaded box)."""
        assert run.returncode == 0, run.stderr[-3000:]
        assert self.pid is not None and self.stopped_after is not None
        print(f"{who} rank 1 killed -> every other process of the attempt gone in {self.stopped_after:.2f} s")
        assert self.stopped_after < 5, self.stopped_after
        assert run.of("run_start")[0]["trainer"] == trainer
        assert [r["rank"] for r in run.of("ranks")[0]["ranks"]] == [0, 1]
        ended = [e for e in run.of("rank_ended") if e["attempt"] == 1]
        assert any((e["rank"], e["pid"]) == (1, self.pid) for e in ended), ended

    def assert_hang_names_rank_1(self, run: SupervisedRun, who: str, processes: int) -> str:
        """The stop's (SIGSTOP) run finished after one hang, whose stacks, in the run dir, name rank 1 the
        straggler and hold at least ``processes`` processes' stacks, the stopped rank's too; prints the time
        from the stop to the stacks; returns the report."""
        assert run.returncode == 0, run.stderr[-3000:]
        assert self.pid is not None and self.at_wall is not None
        assert [f["class"] for f in run.of("fault")] == ["hang"]
        (stacks,) = run.of("hang_stacks")
        print(f"{who} rank 1 stopped -> the hang's stacks taken {float(stacks['ts']) - self.at_wall:.1f} s later")
        assert stacks["stragglers"] == [1] and stacks["processes"] >= processes
        assert self.out / ".trainsup" in Path(stacks["path"]).parents
        report = Path(stacks["path"]).read_text()
        assert "rank 1 stopped: rank 1 is the straggler" in report
        assert report.count("=== pid ") >= processes and f"=== pid {self.pid}:" in report
        return report

    def run(self) -> None:
        run_dir = self.out / ".trainsup"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.at is None:
            time.sleep(0.01)
            try:
                log = (run_dir / "attempt-1.log").read_text(errors="replace")
                events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
            except (OSError, ValueError):
                continue
            ranks = [e["ranks"] for e in events if e["event"] == "ranks" and e["attempt"] == 1]
            if self.marker in log and ranks and len(ranks[-1]) == 2:
                self.pid = next(r["pid"] for r in ranks[-1] if r["rank"] == 1)
                launcher = psutil.Process(self.pid).parent()  # torchrun: the attempt's tree is it and below
                assert launcher is not None
                tree = [launcher, *launcher.children(recursive=True)]
                os.kill(self.pid, self.act)
                self.at, self.at_wall = time.monotonic(), time.time()
                while time.monotonic() < deadline and self.act == signal.SIGKILL:
                    if not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree
                               if p.pid != self.pid):
                        self.stopped_after = time.monotonic() - self.at
                        return
                    time.sleep(0.01)


def supervised(bed: HfBed, out: Path, tmp: Path, policy: str, hook: AtStep) -> SupervisedRun:
    hook.start()
    run = supervise(command(bed, out), out, tmp, env=env(bed), policy=policy, timeout=600, cwd=tmp)
    hook.join(5)
    return run


def test_rank_1_killed_stops_the_whole_tree_within_seconds_and_the_run_ends_as_an_uninterrupted_one(
        hf_bed: HfBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    kill = AtStep(out, signal.SIGKILL, STEP_120)
    run = supervised(hf_bed, out, tmp_path, "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 10\n", kill)
    kill.assert_kill_stopped_the_tree(run, "TRL", "hf")
    assert len(run.of("attempt_start")) == 2
    assert run.of("attempt_start")[1]["resume_step"] in (100, 150)
    assert_as_uninterrupted(hf_bed, out, reference)


def test_rank_1_stopped_is_a_hang_naming_it_the_straggler_then_resumed_as_an_uninterrupted_run(
        hf_bed: HfBed, reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    stop = AtStep(out, signal.SIGSTOP, STEP_60)
    # 8 s without a step once training runs; start-up keeps its own long timeout (a relaunch on a loaded box
    # may take longer than that to its first step)
    policy = "backoff:\n  initial_s: 0.5\n  max_s: 1\nstop:\n  grace_s: 3\nhang:\n  min_timeout_s: 8\n"
    run = supervised(hf_bed, out, tmp_path, policy, stop)
    stop.assert_hang_names_rank_1(run, "TRL", 3)  # torchrun and both ranks, at least
    assert_as_uninterrupted(hf_bed, out, reference)


def test_diagnose_names_the_rank_that_failed_first_not_the_others_consequent_errors(
        hf_bed: HfBed, tmp_path: Path) -> None:
    """Rank 1's optimizer raises at its fifth step (``rank_faults``); rank 0, waiting for it in the next
    gradient all-reduce, fails in turn, and torchrun reports both. ``trainsup diagnose`` on the trainer's own log
    must name rank 1's error."""
    import subprocess

    from tests.conftest import trainsup_cmd

    out, log = tmp_path / "out", tmp_path / "two-ranks.log"
    faults = Path(__file__).resolve().parent / "rank_faults"
    with log.open("w") as sink:
        done = subprocess.run(command(hf_bed, out), cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
                              timeout=600, check=False,
                              env={**env(hf_bed), "PYTHONPATH": str(faults), "TRAINSUP_TEST_FAIL_AT": "1:5"})
    assert done.returncode != 0
    text = log.read_text(errors="replace")
    assert "[rank0]:" in text and "Traceback" in text  # rank 0's consequent failure is in the log too
    said = subprocess.run(trainsup_cmd("diagnose", str(log)), capture_output=True, text=True, timeout=60,
                          check=False)
    assert said.returncode == 0, said.stderr
    assert "evidence: [rank1]: ValueError: rank 1: a sample this rank cannot train on, at step 5" in said.stdout, \
        said.stdout
