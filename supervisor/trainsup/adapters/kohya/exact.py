"""Owns the arithmetic of an sd-scripts resume that ends as if the run had never been interrupted.

Facts of sd-scripts this rests on (seen on the real trainer, see the project's kohya notes):

- An epoch's data order is drawn when its data loader starts (the sampler from torch's global RNG,
  the buckets from Python's), so only a state saved at the end of an epoch restores the exact
  random state the next epoch starts from. A state saved mid-epoch resumes with another order.
- Resumed with ``--initial_step K`` at an epoch's end (and without ``--skip_until_initial_step``,
  whose arithmetic is wrong with gradient accumulation) it starts at epoch K/E + 1 and counts its
  steps from 0: the save it labels L holds step L + K. Its ``global_step >= max_train_steps`` stop
  then never fires and it trains on to the end of the last epoch.
- Its step saves fall where its label is a multiple of ``--save_every_n_steps``, its step samples
  where it is a multiple of ``--sample_every_n_steps`` (epoch numbers stay true).

So a resumed attempt gets a step cadence whose multiples, shifted by the offset, hit every step the
user's own cadence saves at (and the last step, when the trainer would train past it); trainsup
publishes those saves under their true names and stops the trainer once the last step is saved.

That cadence is the gcd of the wanted labels, which can be 1 (8 steps an epoch, a save every 5,
resumed at 8: labels 2, 7, 12): a state at every step. The label count restarts at each launch, and
an epoch's end is an exact resume point, so an attempt may instead cover a *segment*: up to an
epoch's end, with the gcd of the labels wanted inside it, then a relaunch from that epoch's state
(``relaunch_at``; no restart budget spent) whose labels start afresh. An attempt covers the longest
stretch, the rest of the run or up to an epoch's end, whose cadence writes at most the wanted saves
(or samples) plus one a epoch plus one; when none does, the nearest epoch's end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


def epoch_aligned(step: int, per_epoch: int | None) -> bool:
    """Whether a state at this absolute step was saved at the end of an epoch."""
    return bool(per_epoch) and step > 0 and step % per_epoch == 0  # type: ignore[operator]


def steps_per_epoch(batches: int, grad_accum: int = 1) -> int:
    """Optimizer steps per epoch, from the start-up summary's batches and gradient accumulation."""
    return math.ceil(batches / (grad_accum or 1))


def label_offset(resume_step: int, skip_until_initial_step: bool, batches_per_epoch: int,
                 grad_accum: int = 1) -> int:
    """absolute - label for an attempt resumed at ``resume_step``, by sd-scripts' own arithmetic.

    sd-scripts labels the saves of a resumed attempt with a step of its own counting, and its
    ``train_state.json`` repeats that label. With ``--skip_until_initial_step`` it skips whole epochs
    (``initial_step * grad_accum // ceil(batches / grad_accum)`` of them), subtracting ``batches``
    per skipped epoch, and starts its global step at what is left. Without it the global step
    restarts at 0.
    """
    if resume_step <= 0:
        return 0
    if not skip_until_initial_step:
        return resume_step
    initial = resume_step * grad_accum
    per_epoch = steps_per_epoch(batches_per_epoch, grad_accum)
    epochs_skipped = initial // per_epoch if per_epoch else 0
    return resume_step - (initial - epochs_skipped * batches_per_epoch)


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


def label_cadence(steps: Iterable[int], offset: int) -> int | None:
    """The largest cadence whose label multiples hit every one of ``steps`` (None: no step)."""
    every = 0
    for step in steps:
        every = math.gcd(every, step - offset)
    return every or None


@dataclass(frozen=True)
class AttemptSaves:
    """What one attempt's step saves (and step samples) must be, for the output dir to read true."""

    offset: int  # absolute step = the trainer's label + offset
    every: int | None  # --save_every_n_steps for this attempt; None: no step saves at all
    wanted: frozenset[int]  # absolute steps the user's own cadence shows a save of (not shown yet)
    stop_at: int | None  # stop the trainer once the state of this absolute step is complete
    # --sample_every_n_steps for this attempt: None leaves the command's own; 0: no step samples
    sample_every: int | None = None
    relaunch_at: int | None = None  # the segment's end: relaunch from its state once it is complete
    why: str = ""  # why the attempt ends at relaunch_at, in words


@dataclass(frozen=True)
class _Span:
    """One candidate end of an attempt and what its cadences would write up to it."""

    end: int
    every: int | None
    sample_every: int | None
    saves: tuple[int, int]  # (step saves its cadence writes up to ``end``, of them the ones wanted)
    samples: tuple[int, int]  # the same for step samples
    epochs: int

    def fits(self) -> bool:
        return all(written <= wanted + self.epochs + 1 for written, wanted in (self.saves, self.samples))

    def cost(self) -> str:
        """What the span's cadences write beyond what is wanted, in words."""
        said = [f"{written} {what} for {wanted}" for (written, wanted), what in
                ((self.saves, "step saves"), (self.samples, "samples")) if written > wanted + self.epochs + 1]
        return " and ".join(said)


def _span(end: int, offset: int, resume_step: int, max_steps: int, per_epoch: int | None,
          wanted: frozenset[int], samples: frozenset[int], stop_at: int | None, epoch_states: bool) -> _Span:
    last = end == max_steps
    targets = {s for s in wanted if s <= end} | ({stop_at} if last and stop_at is not None else set())
    if not last and not epoch_states:
        targets.add(end)  # no epoch state is saved there: a step state must be, to relaunch from
    every = label_cadence(targets, offset)
    sampled = {s for s in samples if s <= end}
    sample_every = label_cadence(sampled, offset)
    epochs = math.ceil((end - resume_step) / per_epoch) if per_epoch else 1
    return _Span(end, every, sample_every, ((end - offset) // every if every else 0, len(targets)),
                 ((end - offset) // sample_every if sample_every else 0, len(sampled)), epochs)


def attempt_saves(offset: int, resume_step: int, max_steps: int, per_epoch: int | None,
                  user_every: int | None, *, saves_done: frozenset[int] = frozenset(),
                  sample_every: int | None = None, samples_done: frozenset[int] = frozenset(),
                  epoch_states: bool = True, overshoots: bool = True) -> AttemptSaves:
    """The step cadence of an attempt resumed at ``resume_step`` whose labels run ``offset`` behind.

    Every absolute step the user's cadence saves at, and whose save the output dir does not show
    yet (``saves_done``), must be a label multiple: the cadence is the gcd of their distances from the
    offset; likewise the step samples of ``sample_every`` (not ``samples_done``). When the trainer
    would train past the last step, that step must be saved too, so that it can be stopped there and
    its save published as the final weights. ``epoch_states``: trainsup saves a state at every epoch's
    end (``--save_every_n_epochs 1``), so a segment can end there without a step save. ``overshoots``
    False: the trainer stops at the last step by itself (musubi, told the steps left), none is added.
    """
    wanted = save_steps(resume_step, max_steps, user_every) - saves_done
    if offset <= 0:
        return AttemptSaves(0, user_every, wanted, None)
    samples = save_steps(resume_step, max_steps, sample_every) - samples_done
    stop_at = max_steps if overshoots and trains_past(offset, max_steps, per_epoch) else None
    ends = [max_steps]
    if per_epoch:
        first = (resume_step // per_epoch + 1) * per_epoch
        ends = [*range(first, max_steps, per_epoch), max_steps]
    spans = [_span(end, offset, resume_step, max_steps, per_epoch, wanted, samples, stop_at, epoch_states)
             for end in ends]
    chosen = next((s for s in reversed(spans) if s.fits()), spans[0])
    # A command that samples by steps always gets this attempt's cadence: its own would fire on labels.
    sample_cadence = (chosen.sample_every or 0) if sample_every else None
    if chosen.end == max_steps:
        return AttemptSaves(offset, chosen.every, wanted, stop_at, sample_cadence)
    epoch = chosen.end // per_epoch if per_epoch else 0
    why = (f"one cadence from step {resume_step} to {max_steps} would write {spans[-1].cost()}: this "
           f"attempt goes to the end of epoch {epoch} (step {chosen.end}) and is relaunched from there")
    return AttemptSaves(offset, chosen.every, wanted, None, sample_cadence, chosen.end, why)
