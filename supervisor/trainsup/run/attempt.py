"""Owns running one attempt: launch, pump its output, react to live events, stop it, report.

Runs on the decision loop's thread; only the pumps (and the GPU sampler) are threads. Live reactions are few and prompt:
a live fault (NaN loss), a hang (no progress for the hang clock's timeout; the stacks are taken
first) or a stop request stops the whole process group at once; a completed state is validated and
entered in the ledger as soon as its last file is announced.
"""

from __future__ import annotations

import math
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..faults.matchers import Progress
from ..faults.scanner import Evidence, ExitInfo, FaultScanner, classify_exit
from ..record.journal import Journal
from ..sensors import stacks
from ..sensors.hang import HangClock, HangPolicy
from ..trainers.base import OutputFormat
from . import process
from .observe import Observations, OutputParser
from .pump import AttemptLog, Pump


@dataclass
class AttemptResult:
    exit_code: int | None
    signal: int | None
    obs: Observations
    fault: str | None
    evidence: Evidence | None
    uptime_s: float
    stop_signal: int | None  # trainsup was asked to stop
    nan_progress_step: int | None  # attempt-relative bar step where the loss first showed NaN
    stopped_for_change: bool = False  # stopped on purpose (at a checkpoint) to apply an edit
    completed: bool = False  # stopped on purpose: the last step's state is complete, the run is done


@dataclass
class AttemptHooks:
    on_state_done: Callable[[str, Observations], None]
    on_progress: Callable[[Progress], None]
    on_evidence: Callable[[Evidence], None]
    on_summary: Callable[[Observations], None]
    on_file_changed: Callable[[Any], None]
    is_live: Callable[[str], bool]
    success_fallback: Callable[[], bool]  # e.g. the final weights were written during this attempt
    on_hang: Callable[[int, float, HangClock, Observations], Evidence]  # (pid, idle s, clock, obs): stacks
    on_gpu: Callable[[Any], None] = lambda _samples: None  # a GPU sampler's reading
    on_tick: Callable[[], None] = lambda: None  # every pass of the loop (systemd's watchdog)


def run_attempt(argv: list[str], env: dict[str, str], cwd: Path, log_path: Path, scanner: FaultScanner,
                events: queue.Queue[tuple[str, Any]], hooks: AttemptHooks, grace_s: float,
                pump_wait_s: float, echo: bool, spawn: Callable[..., process.Child] = process.spawn,
                clock: Callable[[], float] = time.monotonic, hang: HangPolicy | None = None,
                fmt: OutputFormat | None = None, planned_signal: int = signal.SIGTERM) -> AttemptResult:
    log = AttemptLog(log_path)
    parser = OutputParser(events, scanner, clock, fmt)
    child = spawn(argv, env, cwd)
    assert child.popen.stdout is not None and child.popen.stderr is not None
    pumps = [Pump("stdout", child.popen.stdout, log, 1 if echo else None, parser),
             Pump("stderr", child.popen.stderr, log, 2 if echo else None, parser)]
    for p in pumps:
        p.start()
    started = clock()
    eofs = 0
    exited_at: float | None = None
    stopped_live: str | None = None
    stop_signal: int | None = None
    nan_step: int | None = None
    killed = False
    stopped_for_change = False
    completed = False
    hang_clock = HangClock(hang, started) if hang is not None else None
    hang_evidence: Evidence | None = None
    activity_seen: float | None = None
    try:
        while True:
            hooks.on_tick()
            try:
                kind, payload = events.get(timeout=0.1)
            except queue.Empty:
                kind, payload = "", None
            if kind == "eof":
                eofs += 1
            elif kind == "signal":  # (why the run stops, what the trainer is sent: a save signal at a deadline)
                stop_signal, trainer_signal = payload
                if not killed:
                    process.stop_tree(child, grace_s, trainer_signal)
                    killed = True
            elif kind == "progress":
                if nan_step is None and payload.loss is not None and math.isnan(payload.loss):
                    nan_step = payload.step
                if hang_clock is not None:
                    hang_clock.on_step(payload.step, clock(), f"steps {payload.step}/{payload.total}")
                hooks.on_progress(payload)
            elif kind == "phase":
                if hang_clock is not None:
                    hang_clock.enter(payload[0], clock(), payload[1])
            elif kind == "file_changed":
                hooks.on_file_changed(payload)
            elif kind == "gpu":
                hooks.on_gpu(payload)
            elif kind == "stop_for_change":
                if not killed and exited_at is None:
                    stopped_for_change = True
                    process.stop_tree(child, grace_s, planned_signal)
                    killed = True
            elif kind == "complete":
                if not killed and exited_at is None:
                    completed = True
                    process.stop_tree(child, grace_s, planned_signal)
                    killed = True
            elif kind == "summary":
                hooks.on_summary(parser.obs)
            elif kind == "state_done":
                hooks.on_state_done(payload, parser.obs)
            elif kind == "evidence":
                hooks.on_evidence(payload)
                if hooks.is_live(payload.fault) and not killed and stopped_live is None:
                    stopped_live = payload.fault
                    process.stop_tree(child, grace_s)
                    killed = True
            if exited_at is None and child.popen.poll() is not None:
                exited_at = clock()
            if hang_clock is not None and exited_at is None and not killed:
                if parser.activity_at is not None and parser.activity_at != activity_seen:
                    activity_seen = parser.activity_at
                    hang_clock.on_activity(activity_seen)
                idle = hang_clock.overdue(clock())
                if idle is not None:
                    hang_evidence = hooks.on_hang(child.popen.pid, idle, hang_clock, parser.obs)
                    stopped_live = "hang"
                    process.stop_tree(child, grace_s)
                    killed = True
            if exited_at is not None:
                if eofs >= 2 and events.empty():
                    break
                if clock() - exited_at > pump_wait_s and not killed:
                    # Something still holds the pipes (an orphaned worker): end the whole group.
                    process.stop_tree(child, grace_s)
                    killed = True
    finally:
        if not killed:
            process.stop_tree(child, 0.0 if child.popen.poll() is not None else grace_s)
        for p in pumps:
            p.join(timeout=5)
        log.close()
    exit_code, sig = process.exit_signal(child.popen.returncode)
    obs = parser.obs
    uptime = (exited_at or clock()) - started
    success = completed or obs.success_seen or (exit_code == 0 and hooks.success_fallback())
    obs.child_status, obs.child_signal = scanner.child_status or (None, None)
    info = ExitInfo(exit_code, sig, obs.child_status, obs.child_signal, success)
    if stop_signal is not None or stopped_for_change or completed:
        fault = None
    elif stopped_live is not None:
        fault = stopped_live
    else:
        fault = classify_exit(info, scanner.verdict)
    verdict = hang_evidence if fault == "hang" else scanner.verdict
    evidence = verdict if verdict is not None and verdict.fault == fault else None  # never another fault's line
    if fault == "unknown" and evidence is None:  # never without its line: what the trainer printed last
        evidence = scanner.last_lines_evidence()
    return AttemptResult(exit_code, sig, obs, fault, evidence, uptime, stop_signal, nan_step, stopped_for_change,
                         completed)


def take_hang_stacks(number: int, pid: int, idle_s: float, clock: HangClock, step: int | None,
                     gpu: str | None, run_dir: Path, journal: Journal, say: Callable[[str], None],
                     attempt: int, obs: Observations) -> Evidence:
    """The trainer made no progress for too long: every Python stack of its tree goes to
    ``RUN_DIR/hang-N.txt`` (journal ``hang_stacks``) before it is stopped; returns the hang's evidence."""
    say(f"hang: no progress for {idle_s:.0f} s; taking the stacks of the trainer's processes")
    path = run_dir / f"hang-{number}.txt"
    text, taken, error = stacks.hang_report(pid, idle_s, clock, step, gpu, path)
    if error:
        say(f"warning: cannot write {path}: {error}")
    journal.event("hang_stacks", path=str(path), processes=len(taken),
                  py_spy=all(s.innermost is not None for s in taken), attempt=attempt)
    return Evidence("hang", text, obs.lines, "root")
