"""Owns the diffusers scripts' states: ``OUTPUT_DIR/checkpoint-N/`` (N the true global step), when
one is complete, and which one a resume starts from.

``accelerator.save_state`` writes the weights through the script's save hook
(``pytorch_lora_weights.safetensors``, or a model folder), then ``optimizer.bin``, ``scheduler.bin``
and, last, ``random_states_<i>.pkl`` per process; no marker, no fsync (``trainers.accelerate``). The
script's own ``latest`` takes the highest ``checkpoint*`` name unchecked, complete or not, so trainsup
always names the chosen checkpoint itself (its last component: the script joins it with
``--output_dir``).

The scripts resume exactly only from an epoch's end: they restart the interrupted epoch from its first
batch with a data order drawn anew from the restored random state (seen on the real bed: 1.19e-3 max
|dw| from a mid-epoch checkpoint, 0 from an epoch end). So, as for sd-scripts, the newest epoch-end
checkpoint is preferred when it is at most two save intervals older than the newest; a run that
started at step 0 counts that start as the end of epoch 0 (a fresh restart is exact too). A state at
``--max_train_steps`` is never resumed from: the script would train one step more and write over the
final weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ...record.journal import Journal
from ...record.ledger import Ledger, StateRecord
from ...trainers import accelerate
from ...trainers.base import Plan
from ...trainers.stepstates import StepStates, step_dirs

STATE_NAME = re.compile(r"checkpoint-(\d+)")
PER_EPOCH = "per_epoch"  # the attempt's steps per epoch, kept in the ledger's notes


def checkpoints(out: Path) -> list[tuple[Path, int]]:
    """The ``checkpoint-N`` directories in ``out``, by step."""
    return step_dirs(out, STATE_NAME)


def state_problem(state: Path, processes: int = 1) -> str:
    """'' when ``state`` is a complete checkpoint: accelerate's files all there (the last one
    written included), no temporary file of a write cut short, every safetensors file whole."""
    problem = accelerate.state_problem(state, model=False, processes=processes)
    if problem:
        return problem
    try:
        files = sorted(state.rglob("*"))
    except OSError as exc:
        return f"unreadable ({exc})"
    for f in files:
        if f.name.startswith(".tmp"):
            return f"{f.relative_to(state)}: a write cut short"
        if f.suffix == ".safetensors":
            problem = accelerate.check_safetensors(f)
            if problem:
                return problem
    return ""


class DiffusersStates(StepStates):
    def __init__(self, ledger: Ledger, journal: Journal, say: Callable[[str], None], out: Path, processes: int,
                 every: int | None, publish: Callable[[], str | None] = lambda: None) -> None:
        super().__init__(ledger, journal, say, lambda: checkpoints(out), lambda p: state_problem(p, processes),
                         resume_at_end=False, publish=publish)
        self.every = every  # --checkpointing_steps

    def note_per_epoch(self, per_epoch: int) -> None:
        """The running attempt's steps per epoch, from its start-up summary."""
        rec = self.ledger.attempts[-1] if self.ledger.attempts else None
        if rec is None or rec.notes.get(PER_EPOCH) == per_epoch:
            return
        rec.notes[PER_EPOCH] = per_epoch
        self.ledger.save()

    def per_epoch(self) -> int | None:
        for rec in reversed(self.ledger.attempts):
            value = rec.notes.get(PER_EPOCH)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    def newest(self, nan_step: int | None = None, max_steps: int | None = None, plan: Plan | None = None,
               accept: Callable[[StateRecord], bool] = lambda _state: True) -> StateRecord | None:
        """The newest complete checkpoint, or the newest at an epoch's end when it is at most two save
        intervals older (None, a fresh start, when that end is the run's own step 0)."""
        best = super().newest(nan_step, max_steps, plan, accept)
        per_epoch = self.per_epoch()
        if best is None or per_epoch is None or best.step % per_epoch == 0:
            return best
        aligned = super().newest(nan_step, max_steps, plan, lambda s: accept(s) and s.step % per_epoch == 0)
        from_zero = bool(self.ledger.attempts) and self.ledger.attempts[0].resume_step == 0
        if aligned is None and not from_zero:
            return best
        base = aligned.step if aligned is not None else 0
        if best.step - base > 2 * (self.every or per_epoch):
            self.journal.event("resume_inexact", newest=best.dir, step=best.step, epoch_end=base,
                               reason="the newest epoch end is too far back")
            return best
        self.journal.event("resume_exact", newest=best.dir, step=best.step, epoch_end=base,
                           state=aligned.dir if aligned is not None else None)
        where = f"the end of epoch {base // per_epoch} (step {base})" if base else "step 0 (a fresh start)"
        self.say(f"resuming from {where}, not from step {best.step} mid-epoch: only from an epoch's end does the "
                 "script resume with the same data order")
        return aligned
