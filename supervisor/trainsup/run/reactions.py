"""Owns what the engine makes of a running attempt's output, and of its end, besides stopping the child.

While it runs: the status snapshot from the progress bar (throttled), the quiet console's progress
line, states entered in the ledger as soon as they are complete (or looked for on disk when the
trainer does not announce them), the planned stops that follow (the run complete, a relaunch at a
checkpoint for a scheduled edit), the start-up summary, live faults journaled, a hang's stacks.
When it ended (``conclude``): the states it left, how far it got, ``attempt_end`` and ``fault`` in
the journal and on the console, and the ``Outcome`` the decision reads.

Steps the trainer prints are made absolute here (kohya counts from its resume point).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..faults.classes import fault_class
from ..faults.progress import Progress
from ..faults.scanner import Evidence
from ..record import journalkinds as kinds
from ..record.textfmt import shown_path
from ..sensors.hang import HangClock
from ..sensors.oomkills import NOT_FOR_MEMORY, killed_for_memory, oom_kills
from ..sensors.ranks import Rank, RankEnd
from .attempt import AttemptResult, take_hang_stacks
from .context import RunContext, say
from .deadline import Deadline
from .decide import Outcome
from .events import EventQueue, RunComplete, StopForChange
from .observe import Observations
from .sentences import fault_sentence, progress_sentence
from .spec import NCCL_DUMPS
from .takeover import forget_trainer, record_trainer

STATUS_INTERVAL_S = 0.25
STATES_INTERVAL_S = 0.5  # how often to look on disk for new states when the trainer does not announce them
QUIET_PROGRESS_S = 60.0  # --quiet: a line on the progress this often (and one at each save)


class Reactions:
    def __init__(self, ctx: RunContext, events: EventQueue, deadline: Deadline,
                 clock: Callable[[], float]) -> None:
        self.ctx, self.events, self.deadline, self.clock = ctx, events, deadline, clock
        self.attempt_no = 0
        self.resume_step = 0
        self.child_pid: int | None = None
        self.oom_kills_at_launch: int | None = None
        self.nan_abs_step: int | None = None  # the last attempt's NaN: no state saved at or after it resumes
        self.stop_at_checkpoint = False  # an edit waits for the next complete state
        self.hangs = len(list(ctx.run_dir.glob("hang-*.txt")))  # numbers the hang-N.txt stack reports
        self.begun_at = time.time()  # the attempt's launch (wall clock: the dumps' times are)
        self._status_written = float("-inf")
        self._states_looked = float("-inf")
        self._said_rank_stop = False  # an attempt's first rank that died is said; the ones stopped after, journaled
        self._progress_said = float("-inf")  # --quiet: when the last progress line was said

    def begin(self, attempt: int, resume_step: int) -> None:
        self.attempt_no, self.resume_step = attempt, resume_step
        self.oom_kills_at_launch = oom_kills()
        self.begun_at = time.time()
        self._said_rank_stop = False

    def nccl_dumps(self) -> list[str]:
        """The NCCL flight recorder's dumps this attempt left in the run dir (``spec.flight_recorder_env``)."""
        try:
            found = sorted((self.ctx.run_dir / NCCL_DUMPS).iterdir())
        except OSError:
            return []
        return [str(p) for p in found if p.is_file() and p.stat().st_mtime >= self.begun_at - 1]

    def spawned(self, pid: int) -> None:
        self.child_pid = pid
        record_trainer(self.ctx.run_dir, pid, self.attempt_no)  # for the next supervisor, should we die

    def ranks_found(self, ranks: tuple[dict[str, int | None], ...]) -> None:
        """The processes that train under the launcher, in the status and the journal."""
        self.ctx.status(ranks=list(ranks))
        self.ctx.journal.event(kinds.RANKS, attempt=self.attempt_no, ranks=list(ranks))

    def rank_ended(self, end: RankEnd) -> None:
        self.ctx.journal.event(kinds.RANK_ENDED, attempt=self.attempt_no, rank=end.rank.rank, pid=end.rank.pid,
                               exit_code=end.exit_code, signal=end.signal)
        if end.failed and not self._said_rank_stop:
            self._said_rank_stop = True
            say(f"attempt {self.attempt_no}: {end.says()} while its launcher still runs: stopping every process "
                "of the attempt")

    def ranks_stuck_at_exit(self, pids: tuple[int, ...], waited_s: float) -> None:
        message = (f"training finished and a rank exited cleanly, but pid {', '.join(map(str, pids))} had not "
                   f"exited {waited_s:g} s later (stuck in its teardown): stopping it, the run is done")
        self.ctx.journal.event(kinds.INFO, attempt=self.attempt_no, message=message)
        say(f"attempt {self.attempt_no}: {message}")

    def absolute(self, step: int) -> int:
        """The true step of a step the trainer printed (kohya counts from its resume point)."""
        return step if self.ctx.trainer.output.absolute_steps else self.resume_step + step

    # --- while it runs ---------------------------------------------------------------------------
    def progress(self, progress: Progress) -> None:
        now, t = self.clock(), self.ctx.trainer
        if not t.output.announces_states and now - self._states_looked >= STATES_INTERVAL_S:
            # No line says when a state is complete: look on disk as training goes on.
            self._states_looked = now
            self.state_done(None, None)
        if now - self._status_written < STATUS_INTERVAL_S and progress.step < progress.total:
            return  # a snapshot a few times a second is plenty; the bar may redraw far more often
        self._status_written = now
        loss = None if progress.loss is None or math.isnan(progress.loss) else progress.loss
        total = t.total_steps or progress.total
        step = min(self.absolute(progress.step), total or math.inf)  # stopped at the last, it may begin one more
        self.ctx.status(step=step, total=total, loss=loss, rate=progress.rate)
        if not self.ctx.spec.echo and now - self._progress_said >= QUIET_PROGRESS_S:  # --quiet: no bar shown
            self._progress_said = now
            say(progress_sentence(self.attempt_no, int(step), total, progress.loss, progress.rate))

    def evidence(self, evidence: Evidence) -> None:
        """A live fault's line, journaled as it comes (the attempt stops the child)."""
        self.ctx.journal.event(kinds.FAULT_LIVE, **{"class": evidence.fault}, evidence=evidence.line,
                               line=evidence.lineno, attempt=self.attempt_no)

    def hang(self, pid: int, idle_s: float, clock: HangClock, obs: Observations,
             ranks: list[Rank] | None = None) -> Evidence:
        self.hangs += 1
        step = None if clock.step is None else self.absolute(clock.step)
        gpu = self.ctx.gpu.utilization() if self.ctx.gpu is not None else None
        return take_hang_stacks(self.hangs, pid, idle_s, clock, step, gpu, self.ctx.run_dir,
                                self.ctx.journal, say, self.attempt_no, obs, ranks)

    def summary(self, obs: Observations) -> None:
        """The trainer's start-up summary: the adapter fixes this attempt's step offset, and may warn."""
        if self.child_pid is not None:
            record_trainer(self.ctx.run_dir, self.child_pid, self.attempt_no)  # the training child exists by now
        notice = self.ctx.trainer.on_summary(obs.summary)
        if notice is not None:
            self.ctx.journal.event(kinds.WARNING, attempt=self.attempt_no, **notice.fields, message=notice.message)
            say(notice.console)

    def state_done(self, path: str | None, obs: Observations | None) -> None:
        cwd = self.ctx.spec.cwd
        only = cwd / path if path and (cwd / path).is_dir() else None  # None: look at all
        if obs is not None:
            self.summary(obs)
        points = self.ctx.points
        new = points.collect(only)
        self.deadline.on_states(new)
        if points.run_complete:
            self.events.put(RunComplete())
            return
        if points.relaunch_at_state:  # a planned relaunch (the adapter said why), as an edit's
            self.stop_at_checkpoint = False  # the relaunch applies scheduled edits too
            self.events.put(StopForChange())
            return
        if self.stop_at_checkpoint and new:
            self.stop_at_checkpoint = False
            say(f"step {new[-1].step} is saved ({shown_path(new[-1].dir)}): restarting from it to apply "
                "the scheduled change")
            self.events.put(StopForChange())

    # --- when it ended ---------------------------------------------------------------------------
    def conclude(self, r: AttemptResult) -> Outcome:
        """The states the attempt left and how far it got, journaled; the outcome ``decide`` reads."""
        ctx, points, attempt = self.ctx, self.ctx.points, self.attempt_no
        peaks = ctx.gpu.attempt_ended() if ctx.gpu is not None else None
        forget_trainer(ctx.run_dir)
        self.summary(r.obs)
        points.collect()
        if fault_class(r.fault).voids_save_in_progress and r.obs.saving_state_label is not None:
            points.save_failed(r.obs.saving_state_label)
        # A state saved proves how far it got (the bar may lag; a step begun after the last one is void).
        bar = max(0, self.absolute(r.obs.progress.step) - self.resume_step) if r.obs.progress else 0
        trained = points.steps_proven() if r.completed else max(bar, points.steps_proven())
        ctx.status(step=self.resume_step + trained)  # progress snapshots are throttled
        self.nan_abs_step = None if r.nan_progress_step is None else self.absolute(r.nan_progress_step)
        if self.nan_abs_step is not None:
            points.mark_tainted(self.nan_abs_step)  # saved at or after the NaN: never a resume point
        ctx.journal.event(kinds.ATTEMPT_END, attempt=attempt, exit_code=r.exit_code, signal=r.signal,
                          child_status=r.obs.child_status, child_signal=r.obs.child_signal,
                          uptime_s=round(r.uptime_s, 3), steps_trained=trained,
                          step=self.resume_step + trained, skipped_lines=r.obs.skipped_lines, gpu=peaks,
                          # trainsup stopped it on purpose: its signal is no fault
                          planned_stop=r.planned_stop.value if r.planned_stop is not None else None,
                          **({"rank_ended": r.rank_end.rank.rank if r.rank_end.rank.rank is not None else "trainer"}
                             if r.rank_end is not None else {}),
                          **({"nccl_dumps": dumps} if (dumps := self.nccl_dumps()) else {}))
        foreign_mib = self._journal_fault(r)
        same = (fault_class(r.fault).memory == "host"
                and killed_for_memory(self.oom_kills_at_launch, oom_kills()) is False)
        if same:  # killed, but not for memory: nothing to remedy
            ctx.journal.event(kinds.INFO, attempt=attempt, message=NOT_FOR_MEMORY)
            say(NOT_FOR_MEMORY)
        ev = r.evidence
        return Outcome(attempt=attempt, exit_code=r.exit_code, signal=r.signal, child_status=r.obs.child_status,
                       child_signal=r.obs.child_signal, uptime_s=r.uptime_s, fault=r.fault,
                       evidence=ev.line if ev else None, evidence_line=ev.lineno if ev else None,
                       evidence_groups=ev.groups if ev else {},
                       steps_trained=trained, step=self.resume_step + trained,
                       saved_new_state=points.steps_proven() > 0, ended_at=self.clock(),
                       stop_signal=r.stop_signal, foreign_mib=foreign_mib, same_settings=same)

    def _journal_fault(self, r: AttemptResult) -> int:
        """``fault`` journaled and said; the memory other programs held at an OOM (MiB)."""
        ctx, ev, attempt = self.ctx, r.evidence, self.attempt_no
        gpu_at_oom, foreign_mib = ctx.gpu.oom_details() if fault_class(r.fault).memory == "gpu" and ctx.gpu \
            else (None, 0)
        if r.fault is not None:
            ctx.journal.event(kinds.FAULT, **{"class": r.fault}, evidence=ev.line if ev else None,
                              line=ev.lineno if ev else None, attempt=attempt,
                              **({"gpu": gpu_at_oom} if gpu_at_oom is not None else {}))
            say(fault_sentence(attempt, r, ev, ctx.run_dir / f"attempt-{attempt}.log"))
            ctx.status(last_fault=r.fault, last_fault_evidence=ev.line.strip()[:400] if ev else None)
        return foreign_mib
