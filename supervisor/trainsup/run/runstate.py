"""Owns the supervisor's run states and the table of legal transitions between them."""

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
