"""Owns the deadline signal (``slurm:`` in the policy): the warning a scheduler sends before a job's
end (Slurm's ``--signal=B:USR1@LEAD``), when the run stops after it, and what follows the stop: the
requeue under Slurm, the requeue budget and the exit code.

The handler (``cli``) only records the time the signal came; the decision loop's tick acts on it.
The time left is ``lead_s`` from the signal (Slurm looks every 30 s and sends it once the end is
within lead + 30 s, so it may come up to 30 s early: ``lead_s`` is the least time left). From the
intervals measured between this supervisor's complete states (steps and the save, as they really
took; the first from the trainer's launch) the next state is due one longest interval after the
last. If it is due before the deadline less the stop grace and a margin, the run stops right after
that save; else it stops now, and the newest complete state is the resume point. A trainer whose
stop saves a state (its adapter's ``planned_stop_signal`` is not SIGTERM: OneTrainer backs up on
SIGINT) is stopped now with that signal instead, and the state it writes is the resume point, unless
the periodic save is due sooner than that stop's save can be counted on (the stop grace, after which
SIGKILL ends it). The choice is journaled (``deadline``'s ``choice``). Either way the trainer's whole
tree is stopped and reaped by the attempt (``process.stop_tree``) before the end.

Then, inside a Slurm job (``SLURM_JOB_ID``) with ``requeue`` on, ``scontrol requeue $SLURM_JOB_ID``
and the exit code ``exit_code_after_requeue`` (default 128 + the signal: 138 for USR1). Outside
Slurm the stop is the same and so is the code, without a requeue. The budget: when the journal's
last ``requeue_budget`` requeues all left the same newest complete state as now (no progress between
them), the run is not requeued again and gives up with exit 3. SIGTERM is never the deadline: it
stops the run with 143 and no requeue, even after a deadline signal.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..record import journalkinds as kinds
from ..record.journal import Journal, read_events
from ..record.ledger import StateRecord
from ..trainers.base import StateStore
from .decide import EXIT_GAVE_UP, Decision
from .policy import SlurmPolicy

MARGIN_S = 10.0  # kept in hand after the trainer's stop: the requeue, the journal, the exit
REQUEUE_TIMEOUT_S = 30.0


class Deadline:
    def __init__(self, policy: SlurmPolicy, grace_s: float, clock: Callable[[], float],
                 env: Mapping[str, str]) -> None:
        self.policy = policy
        self.signum = signal.Signals[f"SIG{policy.deadline_signal}"]
        self.grace_s = grace_s
        self.clock = clock
        self.env = env
        self.received_at: float | None = None  # set by the handler
        self.wait_until: float | None = None  # waiting for a save that must be complete by then
        self.acted = False
        self.saved = False  # a state became complete while waiting
        self.last_state_at: float | None = None  # the trainer's launch, then each complete state
        self.interval: float | None = None  # the longest measured between two of them
        self.last_step = -1  # of the newest complete state seen
        self.save_signal: int | None = None  # the trainer's stop signal when it saves a state first

    # --- what the engine tells it ----------------------------------------------------------------
    def signalled(self, _signum: int = 0, _frame: Any = None) -> None:
        """The signal handler: records only (a repeated signal changes nothing)."""
        if self.received_at is None:
            self.received_at = self.clock()

    def launched(self, stop_signal: int = signal.SIGTERM) -> None:
        """A trainer was launched; ``stop_signal`` is its adapter's (``planned_stop_signal``): one other
        than SIGTERM makes the trainer save a state before it exits."""
        self.last_state_at = self.clock()
        self.save_signal = None if stop_signal == signal.SIGTERM else stop_signal

    def on_states(self, new: Sequence[StateRecord]) -> None:
        """New complete states were entered in the ledger (a second state of a step already saved, as
        kohya's epoch state beside its step state, is the same save)."""
        step = max((s.step for s in new), default=-1)
        if step <= self.last_step:
            return
        self.last_step = step
        now = self.clock()
        if self.last_state_at is not None:
            took = now - self.last_state_at
            self.interval = took if self.interval is None else max(self.interval, took)
        self.last_state_at = now
        self.saved = self.wait_until is not None

    def tick(self, journal: Journal, say: Callable[[str], None], request_stop: Callable[[int, int], None],
             stop_signal: int | None) -> None:
        """Acts on a recorded signal; never when a stop was asked for already (SIGTERM stays SIGTERM).
        ``request_stop(reason, trainer_signal)``: the run stops for ``reason`` (the deadline signal),
        the trainer is sent ``trainer_signal``."""
        if self.received_at is None or self.acted or stop_signal is not None:
            return
        now = self.clock()
        name = self.signum.name
        trainer_signal: int = signal.SIGTERM
        if self.wait_until is None:
            choice, due, latest = self.choose(now)
            journal.event(kinds.DEADLINE, signal=name, lead_s=self.policy.lead_s, save_interval_s=_r(self.interval),
                          next_save_in_s=_r(None if due is None else due - now), stop_by_s=_r(latest - now),
                          wait_for_save=choice == "wait_for_save", choice=choice,
                          save_signal=None if self.save_signal is None else signal.Signals(self.save_signal).name)
            ends = f"{name}: the job ends in {self.policy.lead_s:.0f} s; "
            if choice == "wait_for_save":
                assert due is not None
                self.wait_until = latest
                say(f"{ends}the next save is due in {due - now:.0f} s: stopping right after it")
                return
            if choice == "save_on_stop":
                assert self.save_signal is not None
                trainer_signal = self.save_signal
                say(f"{ends}stopping now with {signal.Signals(trainer_signal).name}: the trainer saves a state "
                    "first, and that state is the resume point")
            else:
                say(ends + ("no save can be complete before it" if due is not None else "no save measured yet")
                    + ": stopping now, the newest complete state is the resume point")
        elif self.saved:
            say(f"{name}: the save is complete: stopping")
        elif now >= self.wait_until:
            trainer_signal = self.save_signal or signal.SIGTERM
            with_save = "" if self.save_signal is None else f" with {signal.Signals(trainer_signal).name}"
            say(f"{name}: the save did not come in time: stopping now{with_save}")
        else:
            return
        self.acted = True
        request_stop(self.signum, trainer_signal)

    def choose(self, now: float) -> tuple[str, float | None, float]:
        """Where to stop: ``wait_for_save`` (the periodic save, then stop), ``save_on_stop`` (stop now
        with the trainer's save signal) or ``stop_now``; with when the periodic save is due and the
        latest moment the trainer's stop may begin."""
        signalled = now if self.received_at is None else self.received_at
        latest = signalled + self.policy.lead_s - self.grace_s - MARGIN_S  # the trainer's stop may take the grace
        due = None if self.last_state_at is None or self.interval is None else self.last_state_at + self.interval
        fits = due is not None and due <= latest
        if self.save_signal is None:
            return ("wait_for_save" if fits else "stop_now"), due, latest
        # The stop's own save is counted on only by the end of the grace (SIGKILL then): a periodic
        # save due before that is as soon, and leaves the trainer's regular saves alone.
        sooner = fits and due is not None and due <= now + self.grace_s
        return ("wait_for_save" if sooner else "save_on_stop"), due, latest

    # --- the end ---------------------------------------------------------------------------------
    def conclude(self, decision: Decision, stop_signal: int | None, journal: Journal, points: StateStore,
                 say: Callable[[str], None]) -> Decision:
        """The run's end after a stop by the deadline signal: requeue (or not), and the exit code."""
        if decision.kind != "signal" or stop_signal != self.signum:
            return decision
        code = self.policy.exit_code_after_requeue
        code = 128 + self.signum if code is None else code
        newest = points.newest()
        step = newest.step if newest is not None else None
        job = self.env.get("SLURM_JOB_ID", "").strip()
        restarts = self.env.get("SLURM_RESTART_COUNT")
        why = f"stopped at the deadline ({self.signum.name})"
        if not job or not self.policy.requeue:
            not_why = "not in a Slurm job (no SLURM_JOB_ID)" if not job else "slurm.requeue is off"
            journal.event(kinds.NOT_REQUEUED, reason=not_why, state_step=step)
            return Decision(kind="signal", exit_code=code, reason=f"{why}; {not_why}: not requeued")
        streak = requeues_without_progress(read_events(journal.run_dir), step)
        if streak >= self.policy.requeue_budget:
            journal.event(kinds.REQUEUE_BUDGET_SPENT, job_id=job, restart_count=restarts, requeues=streak,
                          budget=self.policy.requeue_budget, state_step=step)
            return Decision(kind="give_up", exit_code=EXIT_GAVE_UP,
                            reason=f"{why}; {streak} requeue(s) in a row without a new complete state "
                            f"(slurm.requeue_budget {self.policy.requeue_budget}): not requeued again")
        problem = requeue(job)
        if problem is not None:
            journal.event(kinds.REQUEUE_FAILED, job_id=job, error=problem, state_step=step)
            say(f"error: scontrol requeue {job} failed: {problem}")
            return Decision(kind="signal", exit_code=code,
                            reason=f"{why}; scontrol requeue {job} failed: {problem}")
        journal.event(kinds.REQUEUED, job_id=job, restart_count=restarts, state_step=step, streak=streak + 1)
        return Decision(kind="signal", exit_code=code, reason=f"{why}; job {job} requeued")


def requeues_without_progress(events: list[dict[str, Any]], step: int | None) -> int:
    """How many of the journal's last requeues left ``step`` as the newest complete state."""
    streak = 0
    for event in reversed(events):
        if event.get("event") != kinds.REQUEUED:
            continue
        if event.get("state_step") != step:
            break
        streak += 1
    return streak


def requeue(job: str) -> str | None:
    """``scontrol requeue JOB``; None when done, else what went wrong (one line)."""
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                              timeout=REQUEUE_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return "no scontrol on PATH"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return f"exit {done.returncode}: {lines[-1] if lines else 'no output'}"
    return None


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
