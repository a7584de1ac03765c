"""Owns the supervisor's run states, the table of legal transitions between them, and the words a
person reads for them (``shown_state``), the same in ``trainsup status``, on the page and in the queue.

An ended run is ``finished`` (exit 0), ``stopped`` (by a person or a scheduler: SIGINT, SIGTERM, the
deadline signal) or ``failed`` (it gave up after its restart budget, or stopped on a fault a restart
cannot fix). ``status.json`` and the journal keep the supervisor's own states (``gave_up``, ``stopped``
with its exit code); only what is shown to a person is worded this way.
"""

from __future__ import annotations

import enum


class RunState(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    REMEDYING = "remedying"
    BACKOFF = "backoff"
    FINISHED = "finished"
    GAVE_UP = "gave_up"
    STOPPED = "stopped"  # on a fault a restart cannot fix, or by a signal


_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.STARTING: frozenset({RunState.RUNNING, RunState.REMEDYING, RunState.STOPPED,
                                  RunState.GAVE_UP, RunState.BACKOFF}),
    RunState.RUNNING: frozenset({RunState.STOPPING}),
    RunState.STOPPING: frozenset({RunState.REMEDYING, RunState.FINISHED, RunState.GAVE_UP,
                                  RunState.STOPPED, RunState.STARTING}),  # STARTING: applying an edit
    RunState.REMEDYING: frozenset({RunState.BACKOFF, RunState.STOPPED, RunState.GAVE_UP}),
    RunState.BACKOFF: frozenset({RunState.STARTING, RunState.STOPPED}),
    RunState.FINISHED: frozenset(),
    RunState.GAVE_UP: frozenset(),
    RunState.STOPPED: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


def check_transition(current: RunState, new: RunState) -> RunState:
    if new not in _TRANSITIONS[current]:
        raise IllegalTransition(f"illegal run-state transition {current.name} -> {new.name}")
    return new


# trainsup run's exits when a person or a scheduler stopped it: SIGINT, SIGTERM, the deadline signal
STOPPED_EXITS = frozenset({130, 143, 138})
ENDED_SHOWN = ("finished", "failed", "stopped")


def shown_state(state: str, exit_code: int | None) -> str:
    """``state`` (a ``RunState`` value, or another state a reader found: ``lost``, ``new``, ...) as a
    person reads it: an ended run is ``finished``, ``failed`` or ``stopped``."""
    if state == RunState.GAVE_UP.value:
        return "failed"
    if state == RunState.STOPPED.value and exit_code is not None and exit_code not in STOPPED_EXITS:
        return "failed"  # stopped on a fault a restart cannot fix (exit 4)
    return state
