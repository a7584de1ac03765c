"""Owns the arithmetic of an sd-scripts resume that ends as if the run had never been interrupted.

Facts of sd-scripts this rests on (seen on the real trainer, see the project's kohya notes):

- An epoch's data order is drawn when its data loader starts (the sampler from torch's global RNG,
  the buckets from Python's), so only a state saved at the end of an epoch restores the exact
  random state the next epoch starts from. A state saved mid-epoch resumes with another order.
- Resumed with ``--initial_step K`` at an epoch's end (and without ``--skip_until_initial_step``,
  whose arithmetic is wrong with gradient accumulation) it starts at epoch K/E + 1 and counts its
  steps from 0: the save it labels L holds step L + K. Its ``global_step >= max_train_steps`` stop
  then never fires and it trains on to the end of the last epoch.
- Its step saves fall where its label is a multiple of ``--save_every_n_steps``.

So a resumed attempt gets a step cadence whose multiples, shifted by the offset, hit every step the
user's own cadence saves at (and the last step, when the trainer would train past it); trainsup
publishes those saves under their true names and stops the trainer once the last step is saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def epoch_aligned(step: int, per_epoch: int | None) -> bool:
    """Whether a state at this absolute step was saved at the end of an epoch."""
    return bool(per_epoch) and step > 0 and step % per_epoch == 0  # type: ignore[operator]


def save_steps(after: int, upto: int, every: int | None) -> frozenset[int]:
    """The absolute steps in (after, upto] that a step cadence of ``every`` saves at."""
    if not every or every <= 0:
        return frozenset()
    first = (after // every + 1) * every
    return frozenset(range(first, upto + 1, every))


def trains_past(offset: int, max_steps: int, per_epoch: int | None) -> int:
    """Steps sd-scripts would train past ``max_steps`` in an attempt whose labels run ``offset`` behind."""
    if offset <= 0 or not per_epoch:
        return 0
    return math.ceil(max_steps / per_epoch) * per_epoch - max_steps


@dataclass(frozen=True)
class AttemptSaves:
    """What one attempt's step saves must be, for the output dir to read true."""

    offset: int  # absolute step = the trainer's label + offset
    every: int | None  # --save_every_n_steps for this attempt; None: no step saves at all
    wanted: frozenset[int]  # absolute steps the user's own cadence shows a save of
    stop_at: int | None  # stop the trainer once the state of this absolute step is complete


def attempt_saves(offset: int, resume_step: int, max_steps: int, per_epoch: int | None,
                  user_every: int | None) -> AttemptSaves:
    """The step cadence of an attempt resumed at ``resume_step`` whose labels run ``offset`` behind.

    Every absolute step the user's cadence saves at must be a label multiple: the cadence is the gcd
    of their distances from the offset. When the trainer would train past the last step, that step
    must be saved too, so that it can be stopped there and its save published as the final weights.
    """
    wanted = save_steps(resume_step, max_steps, user_every)
    if offset <= 0:
        return AttemptSaves(0, user_every, wanted, None)
    stop_at = max_steps if trains_past(offset, max_steps, per_epoch) else None
    needed = set(wanted) | ({max_steps} if stop_at is not None else set())
    every = 0
    for step in needed:
        every = math.gcd(every, step - offset)
    return AttemptSaves(offset, every or None, wanted, stop_at)
