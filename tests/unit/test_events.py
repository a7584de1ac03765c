"""The decision loop's events (``run.events``): typed, on a queue a signal handler may post to."""

from __future__ import annotations

import queue
import signal
from pathlib import Path

from trainsup.run.engine import Supervisor
from trainsup.run.events import PhaseEntered, StopRequested, new_queue, next_event
from trainsup.run.policy import Policy
from trainsup.run.spec import RunSpec


def test_a_stop_request_only_records_on_a_reentrant_queue(tmp_path: Path) -> None:
    """The handler's post must not take a lock the main thread may hold in ``get`` (``queue.Queue``
    does: bpo-14976); ``SimpleQueue.put`` is reentrant."""
    sup = Supervisor(RunSpec(("true",), tmp_path, tmp_path / "run", {}, False, None), Policy())
    sup.request_stop(signal.SIGUSR1, signal.SIGINT)
    assert isinstance(sup.events, queue.SimpleQueue) and sup.stop_signal == signal.SIGUSR1
    assert next_event(sup.events, 0) == StopRequested(signal.SIGUSR1, signal.SIGINT)
    assert next_event(sup.events, 0) is None


def test_events_are_values() -> None:
    events = new_queue()
    events.put(PhaseEntered("saving", "saving state at step 10"))
    assert events.get_nowait() == PhaseEntered("saving", "saving state at step 10")
