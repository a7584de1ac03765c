"""Owns the run's end: the deadline's part in a stop (a requeue, its code), what remedies changed
(``trained_with``), the final weights published or the reason it stopped, journaled (``finished`` or
``gave_up``) and said, the last status and systemd's STOPPING, the records closed and the lease given up;
or, when the project's command was edited, the hand-over to a new supervisor (``hand_over``).
"""

from __future__ import annotations

import signal

from ..record import journalkinds as kinds
from ..record.textfmt import shown_path
from . import trainedwith
from .context import RunContext, say
from .deadline import Deadline
from .decide import EXIT_STOPPED, Decision
from .rundir import HANDED_OVER_ENV
from .runstate import RunState
from .sentences import end_sentence


def stopped_by_signal(sig: int | None) -> Decision:
    sig = sig or signal.SIGTERM
    return Decision(kind="signal", exit_code=128 + sig, reason=f"stopped by {signal.Signals(sig).name}")


def end_run(ctx: RunContext, decision: Decision, deadline: Deadline, stop_signal: int | None,
            attempt: int | None) -> tuple[int, RunState]:
    """The run ended with ``decision`` (after attempt ``attempt``, if any): its exit code and last state."""
    decision = deadline.conclude(decision, stop_signal, ctx.journal, ctx.points, say)
    code = decision.exit_code if decision.exit_code is not None else EXIT_STOPPED
    trained_with = trainedwith.conclude(ctx.run_dir, decision.kind, say)  # what remedies changed
    if decision.kind == "finish":
        final = ctx.points.publish_final()
        ctx.journal.event(kinds.FINISHED, reason=decision.reason, final_weights=final, attempt=attempt,
                          trained_with=trained_with)
        state = RunState.FINISHED
        say(f"training finished: the final weights are {shown_path(final)}" if final else
            "training finished (the trainer wrote no final weights trainsup knows of)")
    else:
        ctx.journal.event(kinds.GAVE_UP, reason=decision.reason, exit_code=code, attempt=attempt,
                          trained_with=trained_with)
        state = RunState.GAVE_UP if decision.kind == "give_up" else RunState.STOPPED
        say(end_sentence(state.value, code, decision.reason))
    ctx.status(state=state.value, exit_code=code, reason=decision.reason)
    ctx.notifier.stopping(f"{state.value}: {decision.reason}")
    ctx.close()
    ctx.owner.lease.release()  # not at a hand-over: the same pid goes on holding the run
    return code, state


def hand_over(ctx: RunContext, attempt: int) -> dict[str, str]:
    """The project's command was edited: the records closed for a new supervisor on the edited file,
    which the CLI execs with the environment returned (``reexec``)."""
    ctx.journal.event(kinds.SUPERVISOR_RESTART, reason="the project's command changed", attempt=attempt)
    say("the project's command changed: restarting trainsup on the edited file")
    ctx.close()
    # The lock stays held (never a moment without a supervisor), and the run dir stays this run's.
    return {**ctx.owner.lock.hand_over(), HANDED_OVER_ENV: str(ctx.run_dir)}
