"""Owns one attempt: its child, pumps and log, what stops the child, and how the attempt ended.

``Attempt`` is polled by the decision loop (``run.engine``) on its own thread; only the pumps (and
the GPU sampler) are threads. The loop hands it each event (``apply``), asks after the child and the
hang clock (``poll``) until it is ``done``, then ``close`` and ``result``. What ends the child is
prompt: a stop request, the engine's planned stops (a checkpoint to relaunch from, the run
complete), a live fault (NaN loss) or a hang (the engine takes the stacks first) stop the whole
process group at once. ``take_hang_stacks`` writes a hang's stacks for the engine.

Under a launcher the attempt also watches the processes that train (``sensors.ranks``): when one ends
badly while the launcher lives on, the whole group is stopped within seconds (the others could wait in a
collective for minutes, and a launcher takes seconds to notice), and the attempt ends as that rank did.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ..faults.scanner import Evidence, ExitInfo, FaultScanner, classify_exit
from ..record import journalkinds as kinds
from ..record.journal import Journal
from ..sensors import stacks
from ..sensors.hang import HangClock, HangPolicy
from ..sensors.ranks import Rank, RankEnd, RankWatch, is_launcher
from ..trainers.base import OutputFormat, PreStep
from . import process
from .events import (
    Eof,
    Event,
    EventQueue,
    PhaseEntered,
    ProgressSeen,
    RankEnded,
    RanksFound,
    RanksStuckAtExit,
    RunComplete,
    StopForChange,
    StopRequested,
    next_event,
)
from .observe import Observations, OutputParser
from .pump import AttemptLog, Pump

RANK_GRACE_S = 1.0  # after a rank died: the launcher's time to say how, before its group is stopped
# after the run's success line and a rank's clean exit: the other ranks' time to exit before they are stopped
# (seen: a rank of TRL's two gloo ranks idle in its interpreter's exit for good once rank 0 had exited)
RANKS_EXIT_GRACE_S = 30.0


class PlannedStop(StrEnum):
    """Why trainsup stopped a trainer on purpose (no fault); the value is ``attempt_end``'s ``planned_stop``."""

    RUN_COMPLETE = "run_complete"  # the last step's state is complete: the run is done
    RELAUNCH = "relaunch"  # at a checkpoint, to apply an edit
    STUCK_AT_EXIT = "stuck_at_exit"  # the run had finished; ranks stuck in their teardown were stopped


@dataclass(kw_only=True)
class AttemptResult:
    exit_code: int | None
    signal: int | None
    obs: Observations
    fault: str | None
    evidence: Evidence | None
    uptime_s: float
    stop_signal: int | None  # trainsup was asked to stop
    nan_progress_step: int | None  # attempt-relative bar step where the loss first showed NaN
    planned_stop: PlannedStop | None = None  # trainsup stopped it on purpose, and why (``PlannedStop``)
    rank_end: RankEnd | None = None  # the rank whose end stopped the launcher's whole group

    @property
    def stopped_for_change(self) -> bool:
        return self.planned_stop == PlannedStop.RELAUNCH

    @property
    def completed(self) -> bool:
        return self.planned_stop == PlannedStop.RUN_COMPLETE


@dataclass(frozen=True, kw_only=True)
class AttemptSpec:
    """What one attempt runs and how it is stopped."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    grace_s: float
    pump_wait_s: float  # after the child exits, how long its pipes may stay open
    echo: bool
    hang: HangPolicy | None = None
    fmt: OutputFormat | None = None
    planned_signal: int = signal.SIGTERM  # the trainer's own stop (OneTrainer: SIGINT, it backs up first)
    before: tuple[PreStep, ...] = ()  # programs run to their end first (``engine.Supervisor._pre_steps``)
    watch_ranks: bool = True  # watch the processes that train under a launcher (``sensors.ranks``)


class Attempt:
    """One launch of the trainer, polled by the decision loop: ``start``, then per event ``apply`` and
    ``poll`` until ``done``, then ``close`` (always) and ``result``.

    The attempt owns its child, pumps and log, and what ends the child: a stop request, the engine's
    planned stops, a live fault or a hang (the engine says which; the attempt stops the whole group).
    """

    def __init__(self, launch: AttemptSpec, scanner: FaultScanner, events: EventQueue, *,
                 spawn: Callable[..., process.Child] = process.spawn,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.launch, self.scanner, self.events, self.spawn, self.clock = launch, scanner, events, spawn, clock
        self.parser = OutputParser(events, scanner, clock, launch.fmt)
        self.log: AttemptLog | None = None
        self.child: process.Child | None = None
        self.pumps: list[Pump] = []
        self.started = clock()  # again once the child is spawned
        self.eofs = 0
        self.exited_at: float | None = None
        self.stopped_live: str | None = None  # the live fault or "hang" it was stopped for
        self.stop_signal: int | None = None
        self.nan_step: int | None = None
        self.killed = False
        self.planned_stop: PlannedStop | None = None
        self.hang_clock: HangClock | None = None  # from the start
        self.rank_watch: RankWatch | None = None
        self.rank_end: RankEnd | None = None  # the first rank that ended badly (or unknown) under the launcher
        self.rank_end_at = 0.0
        self.rank_exited_0_at: float | None = None  # when the first rank was seen to exit 0
        self.rank_ended_unread_at: float | None = None  # when the first rank ended, how not known
        self.stopped_for_rank = False
        self.hang_evidence: Evidence | None = None
        self._activity_seen: float | None = None

    @property
    def obs(self) -> Observations:
        return self.parser.obs

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.popen.pid

    def start(self) -> None:
        """Spawn the child (``process.LaunchError`` when it cannot start) and its pumps."""
        self.log = AttemptLog(self.launch.log_path)
        try:
            child = self.child = self.spawn(self.launch.argv, self.launch.env, self.launch.cwd)
        except BaseException:
            self.log.close()
            raise
        assert child.popen.stdout is not None and child.popen.stderr is not None
        echo = self.launch.echo
        self.pumps = [Pump("stdout", child.popen.stdout, self.log, 1 if echo else None, self.parser),
                      Pump("stderr", child.popen.stderr, self.log, 2 if echo else None, self.parser)]
        for p in self.pumps:
            p.start()
        self.started = self.clock()
        if self.launch.hang is not None:
            self.hang_clock = HangClock(self.launch.hang, self.started)
        if self.launch.watch_ranks:
            self.rank_watch = RankWatch(child.popen.pid, is_launcher(self.launch.argv))

    def apply(self, event: Event) -> None:
        """What an event means for the child: the pipes' ends, stops, progress for the hang clock."""
        match event:
            case Eof():
                self.eofs += 1
            case StopRequested(signum=signum, trainer_signal=trainer_signal):
                self.stop_signal = signum  # why the run stops; the trainer gets trainer_signal
                self._stop(trainer_signal)
            case ProgressSeen(progress=p):
                if self.nan_step is None and p.loss is not None and math.isnan(p.loss):
                    self.nan_step = p.step
                if self.hang_clock is not None:
                    self.hang_clock.on_step(p.step, self.clock(), f"steps {p.step}/{p.total}", p.total)
            case PhaseEntered(phase=phase, line=line):
                if self.hang_clock is not None:
                    self.hang_clock.enter(phase, self.clock(), line)
            case StopForChange():
                if not self.killed and self.exited_at is None:
                    self.planned_stop = PlannedStop.RELAUNCH
                    self._stop(self.launch.planned_signal)
            case RunComplete():
                if not self.killed and self.exited_at is None:
                    self.planned_stop = PlannedStop.RUN_COMPLETE
                    self._stop(self.launch.planned_signal)

    def stop_live(self, fault: str) -> None:
        """A live fault (NaN loss): the trainer does not stop by itself."""
        if not self.killed and self.stopped_live is None:
            self.stopped_live = fault
            self._stop(signal.SIGTERM)

    def poll(self) -> float | None:
        """Notes the child's exit; the seconds without progress when the hang clock ran out (the
        engine takes the stacks, then ``stop_hung``), else ``None``."""
        assert self.child is not None
        if self.exited_at is None and self.child.popen.poll() is not None:
            self.exited_at = self.clock()
        if self.exited_at is None and not self.killed and self.rank_watch is not None:
            self._watch_ranks()
        if self.exited_at is not None and not self.done and not self.killed and self.child.popen.returncode != 0 \
                and self.rank_watch is not None and self.rank_watch.known:
            self._stop(signal.SIGTERM)  # the launcher died and left its ranks training: orphans, stopped now
        if self.exited_at is not None and not self.done and self.clock() - self.exited_at > self.launch.pump_wait_s:
            self._stop(signal.SIGTERM)  # something still holds the pipes (an orphaned worker): end the group
        if self.hang_clock is None or self.exited_at is not None or self.killed:
            return None
        activity = self.parser.activity_at
        if activity is not None and activity != self._activity_seen:
            self._activity_seen = activity
            self.hang_clock.on_activity(activity)
        return self.hang_clock.overdue(self.clock())

    def _watch_ranks(self) -> None:
        """Say which ranks there are; stop the group a second after one ended badly while the launcher lives
        on (the launcher may still print how it ended).

        A rank whose end is not known (its launcher reaped it before trainsup read how) stops nothing until
        the launcher says it failed: a rank that exited 0 reads the same, and rank 0 may still be writing the
        final weights (seen on sd-scripts under ``accelerate launch --num_processes 2``: rank 1 ends first,
        reaped at once, while rank 0 saves). A launcher that watches its ranks (torchrun, accelerate,
        deepspeed) stops the rest itself within a second of a failure; where none does, the hang timeout
        is the bound."""
        assert self.rank_watch is not None
        now = self.clock()
        ends, changed = self.rank_watch.poll(now)
        if changed:
            self.events.put(RanksFound(tuple(r.record() for r in self.rank_watch.ranks)))
        for end in ends:
            self.events.put(RankEnded(end))
            if end.failed is False and self.rank_exited_0_at is None:
                self.rank_exited_0_at = now
            if end.failed is None and self.rank_ended_unread_at is None:
                self.rank_ended_unread_at = now
            if end.failed is not False and (self.rank_end is None or (end.failed and not self.rank_end.failed)):
                self.rank_end, self.rank_end_at = end, now  # a known failure over an end not known
        self._stop_ranks_stuck_at_exit(now)
        if self.rank_end is None:
            return
        said = self.scanner.child_status
        known = self.rank_end.failed or (said is not None and said != (0, None))
        if not known:
            return
        if now - self.rank_end_at >= RANK_GRACE_S:
            self.stopped_for_rank = True
            self._stop(signal.SIGTERM)

    def _stop_ranks_stuck_at_exit(self, now: float) -> None:
        """The run is done and a rank ended cleanly, and the other ranks have not exited
        ``RANKS_EXIT_GRACE_S`` later: they are stuck in their teardown (a process group's peer gone), not
        training; the attempt stops them and ends as finished. Done: the trainer's success line, after
        which a rank's end that could not be read counts; or the steps bar at its total, after which only a
        rank seen to exit 0 does (one that crashed in the final save reads the same as one that finished)."""
        assert self.rank_watch is not None
        # The hang clock's phase, not the bar alone: a save begun after the last step (rank 0 writing the
        # final weights while rank 1 has exited 0) is no teardown, however long it takes.
        at_total = self.hang_clock is not None and self.hang_clock.phase == "finishing"
        ended = [t for t in (self.rank_exited_0_at if self.obs.success_seen or at_total else None,
                             self.rank_ended_unread_at if self.obs.success_seen else None) if t is not None]
        if self.planned_stop is not None or not ended or not self.rank_watch.known \
                or now - min(ended) < RANKS_EXIT_GRACE_S:
            return
        self.events.put(RanksStuckAtExit(tuple(sorted(self.rank_watch.known)), round(now - min(ended), 1)))
        self.planned_stop = PlannedStop.STUCK_AT_EXIT
        self._stop(signal.SIGTERM)

    @property
    def ranks(self) -> list[Rank]:
        return self.rank_watch.ranks if self.rank_watch is not None else []

    def stop_hung(self, evidence: Evidence) -> None:
        self.hang_evidence, self.stopped_live = evidence, "hang"
        self._stop(signal.SIGTERM)

    @property
    def done(self) -> bool:
        """The child exited and both pipes were read to their end (every event of it is in)."""
        return self.exited_at is not None and self.eofs >= 2 and self.events.empty()

    def close(self) -> None:
        """Whatever happened: the group stopped and reaped, the pumps joined, the log closed."""
        if self.child is None:
            return
        if not self.killed:
            process.stop_tree(self.child, 0.0 if self.child.popen.poll() is not None else self.launch.grace_s)
        for p in self.pumps:
            p.join(timeout=5)
        if self.log is not None:
            self.log.close()

    def _stop(self, sig: int) -> None:
        if not self.killed:
            assert self.child is not None
            process.stop_tree(self.child, self.launch.grace_s, sig)
            self.killed = True

    def result(self, success_fallback: Callable[[], bool] = lambda: False) -> AttemptResult:
        """How it ended; ``success_fallback``: success without a success line (the final weights were
        written during this attempt), asked only when the child exited 0."""
        assert self.child is not None
        exit_code, sig = process.exit_signal(self.child.popen.returncode)
        obs, scanner = self.parser.obs, self.scanner
        finished = self.planned_stop in (PlannedStop.RUN_COMPLETE, PlannedStop.STUCK_AT_EXIT)
        success = finished or obs.success_seen or (exit_code == 0 and success_fallback())
        obs.child_status, obs.child_signal = scanner.child_status or (None, None)
        rank_end = self.rank_end if self.stopped_for_rank else None
        if rank_end is not None:
            # trainsup stopped the launcher: the attempt ended as the rank did, not by trainsup's signal
            exit_code, sig, success = None, None, False
            if scanner.child_status is None:
                obs.child_status, obs.child_signal = rank_end.exit_code, rank_end.signal
        info = ExitInfo(exit_code, sig, obs.child_status, obs.child_signal, success)
        if self.stop_signal is not None or self.planned_stop is not None:
            fault = None
        elif self.stopped_live is not None:
            fault = self.stopped_live
        else:
            fault = classify_exit(info, scanner.verdict)
        verdict = self.hang_evidence if fault == "hang" else scanner.verdict
        evidence = verdict if verdict is not None and verdict.fault == fault else None  # never another fault's line
        if fault == "unknown" and evidence is None:  # never without its line: what the trainer printed last
            evidence = scanner.last_lines_evidence()
        return AttemptResult(exit_code=exit_code, signal=sig, obs=obs, fault=fault, evidence=evidence,
                             uptime_s=(self.exited_at or self.clock()) - self.started, stop_signal=self.stop_signal,
                             nan_progress_step=self.nan_step, planned_stop=self.planned_stop, rank_end=rank_end)


def run_attempt(launch: AttemptSpec, scanner: FaultScanner, events: EventQueue, *,
                spawn: Callable[..., process.Child] = process.spawn,
                clock: Callable[[], float] = time.monotonic) -> AttemptResult:
    """One attempt with nothing else listening: every event goes to the attempt, a hang is not timed
    (the engine's loop is ``engine.Supervisor``; this is the seam the process tests use)."""
    attempt = Attempt(launch, scanner, events, spawn=spawn, clock=clock)
    attempt.start()
    try:
        while not attempt.done:
            event = next_event(events, 0.1)
            if event is not None:
                attempt.apply(event)
            attempt.poll()
    finally:
        attempt.close()
    return attempt.result()


def take_hang_stacks(number: int, pid: int, idle_s: float, clock: HangClock, step: int | None,
                     gpu: str | None, run_dir: Path, journal: Journal, say: Callable[[str], None],
                     attempt: int, obs: Observations, ranks: list[Rank] | None = None) -> Evidence:
    """The trainer made no progress for too long: every Python stack of its tree goes to
    ``RUN_DIR/hang-N.txt`` (journal ``hang_stacks``, with the straggler ranks when there are ranks)
    before it is stopped; returns the hang's evidence."""
    say(f"hang: no progress for {idle_s:.0f} s; taking the stacks of the trainer's processes")
    path = run_dir / f"hang-{number}.txt"
    text, groups, taken, error = stacks.hang_report(pid, idle_s, clock, step, gpu, path, ranks)
    if error:
        say(f"warning: cannot write {path}: {error}")
    late = groups.get("straggler")
    journal.event(kinds.HANG_STACKS, path=str(path), processes=len(taken),
                  py_spy=all(s.innermost is not None for s in taken), attempt=attempt,
                  **({"stragglers": [int(r) if r.isdigit() else None for r in late.split(",")]} if late else {}))
    return Evidence("hang", text, obs.lines, "root", groups=groups)
