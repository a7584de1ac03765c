"""Owns the run's resume points: which saved states belong to which attempt, and which one is safe.

An attempt claims only the complete states it wrote itself (validated, and newer than its launch,
so a same-named state of an earlier run is never mistaken for one of ours), maps their kohya
labels to absolute steps through the ledger, and names itself so it cannot overwrite what an
earlier attempt wrote. Choosing where to resume skips bad (half-saved) states and, after a NaN, any
state from the NaN step on or whose weights are not finite; among the rest it prefers a state at an
epoch's end, the only point sd-scripts resumes from exactly (``exact``; a ``Dialect`` without that
preference takes the newest). Each claimed save is then
published under its true name or hidden in the run dir (``publish``), and so is each sample
(``samples``); the state of the last step ends the run when the trainer would train past it, and
the state at the end of an attempt's segment has it relaunched from there (``relaunch_at_state``).
"""

from __future__ import annotations

import glob
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...record.journal import Journal
from ...record.ledger import AttemptRecord, Ledger, StateRecord
from ...trainers import accelerate
from ...trainers.accelerate import check_safetensors
from ...trainers.base import Launch, Plan
from ...trainers.ledgerstates import LedgerStates
from .dialect import KOHYA, Dialect
from .exact import AttemptSaves, attempt_saves, epoch_aligned, label_offset, save_steps, steps_per_epoch
from .identity import outputs_under
from .profile import final_weights_name, parse_state_name, save_names, state_dir_names
from .publish import Publisher
from .samples import SampleCadence, SampleShelf
from .states import StateCheck, check_state, state_dirs
from .weights import has_non_finite


@dataclass(frozen=True)
class Cadence:
    """What the user's command saves (with trainsup's additions for a command that saves nothing)."""

    max_steps: int
    every_steps: int | None
    every_epochs: int | None  # the user's own epoch cadence; trainsup saves every epoch regardless
    ext: str = "safetensors"
    epoch_states: bool = True  # a state at every epoch's end (trainsup's --save_every_n_epochs 1)


def _names(output_name: str | None) -> set[str]:
    step, epoch, final = state_dir_names(output_name)
    return {step, epoch, final[: -len("-state")]}


# What this adapter keeps of an attempt in the ledger's notes: whether it was launched with
# --skip_until_initial_step, and its start-up summary's batches per epoch and gradient accumulation.
# A ledger written before notes existed held them as fields of these names: the ledger hands such
# keys to notes, so a run dir from then resumes.
SKIPS, BATCHES, GRAD_ACCUM = "skips", "batches", "grad_accum"


def attempt_notes(skips: bool, batches: int | None = None, grad_accum: int | None = None) -> dict[str, Any]:
    return {SKIPS: skips, BATCHES: batches, GRAD_ACCUM: grad_accum}


def _note_int(rec: AttemptRecord, key: str) -> int | None:
    value = rec.notes.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def skips(rec: AttemptRecord) -> bool:
    """Launched with --skip_until_initial_step (a mid-epoch resume: sd-scripts' label arithmetic)."""
    return bool(rec.notes.get(SKIPS, True))


def ledger_per_epoch(ledger: Ledger) -> int | None:
    """Optimizer steps per epoch, as the newest attempt's start-up summary said."""
    for a in reversed(ledger.attempts):
        batches = _note_int(a, BATCHES)
        if batches:
            return steps_per_epoch(batches, _note_int(a, GRAD_ACCUM) or 1)
    return None


def _offset(resume_step: int, skips: bool) -> int | None:
    """An attempt's label offset at launch: 0 from the beginning; at an epoch's end (no skipping)
    kohya counts from 0; mid-epoch only the start-up summary tells (``summary``)."""
    if resume_step == 0:
        return 0
    return None if skips else resume_step


class ResumePoints(LedgerStates):
    announce_on_claim = False  # said once published or hidden (``_settle``): where the state stays

    def __init__(self, ledger: Ledger, output_dir: Path, need_scaler: bool, journal: Journal,
                 say: Callable[[str], None], user_output_name: str | None = None,
                 cadence: Cadence | None = None, run_dir: Path | None = None,
                 samples: SampleCadence | None = None, dialect: Dialect = KOHYA, processes: int = 1) -> None:
        super().__init__(ledger, journal, say)
        self.output_dir, self.need_scaler = output_dir, need_scaler
        self.dialect, self.processes = dialect, processes  # what a complete state holds, how labels count
        self.user_output_name = user_output_name  # where the final weights are published
        self.cadence = cadence or Cadence(0, None, None)
        self.run_started = time.time()
        self.attempt_started = self.run_started
        self.output_name: str | None = None
        self.saves = AttemptSaves(0, self.cadence.every_steps, frozenset(), None)
        self.final_from: tuple[Path, Path | None] | None = None  # (weights, state) of the last step
        self.publisher = Publisher(output_dir, run_dir or output_dir / ".trainsup", self.run_started,
                                   journal.event, ledger.moved, lambda p: self._check(p, False).ok)
        self.samples = None if samples is None else SampleShelf(
            output_dir / "sample", self.publisher.run_dir, user_output_name, samples, self.run_started, journal.event)
        self.segment_end_saved = False  # the state the segment's relaunch starts from is complete
        self.epoch_seen: Callable[[], int] = lambda: 0  # the newest epoch the trainer began (adapter's)

    def continue_ledger(self) -> None:
        """A ledger left by an earlier supervisor of this run dir (it died, or was stopped): claim
        the complete states its last attempt saved (it may have died before it could), and count
        the run from its first launch, so nothing it wrote looks like the user's own."""
        if not self.ledger.attempts:
            return
        last = self.ledger.attempts[-1]
        self.attempt, self.output_name, self.resume_step = last.attempt, last.output_name, last.resume_step
        self.attempt_started = last.started if last.started is not None else self.run_started
        self.run_started = min(self.ledger.run_started() or self.run_started, self.run_started)
        self.publisher.run_started = self.run_started
        if self.samples is not None:
            self.samples.run_started = self.run_started
        self.saves = self._plan(last)
        self.collect()

    # --- one attempt -----------------------------------------------------------------------------
    def plan_attempt(self, attempt: int, resume_step: int, output_name: str | None = None,
                     skips: bool = True) -> AttemptSaves:
        """The step saves an attempt launched so must make (the adapter builds its argv from them):
        what an earlier attempt left incomplete is set aside first; the ledger is not written."""
        self._set_aside_leftovers(attempt)
        return self._plan(AttemptRecord(attempt, output_name, resume_step, _offset(resume_step, skips), None,
                                        attempt_notes(skips)))

    def begin(self, attempt: int, launch: Launch) -> None:
        """Enter the attempt in the ledger, as it was planned (``plan_attempt``)."""
        self.attempt, self.output_name, self.resume_step = attempt, launch.output_name, launch.resume_step
        self.attempt_started = time.time()
        self.run_complete, self.final_from = False, None
        self.relaunch_at_state = self.segment_end_saved = False
        # Launched with --skip_until_initial_step unless its labels are known (from 0, or at an epoch's end).
        skipping = launch.resume_step == 0 or launch.label_offset is None
        rec = AttemptRecord(attempt, launch.output_name, launch.resume_step, launch.label_offset,
                            round(self.attempt_started, 3), attempt_notes(skipping))
        self.ledger.attempts.append(rec)
        self.ledger.save()
        self.saves = self._plan(rec)

    def _set_aside_leftovers(self, attempt: int) -> None:
        """What an earlier attempt left under its own ``NAME-trainsupN`` name and never completed (it
        was killed mid-save) goes into ``RUN_DIR/set-aside/``: no attempt will finish it, and no
        uninterrupted run would show it. Its complete saves were hidden or published when claimed."""
        for rec in self.ledger.attempts:
            if rec.attempt == attempt or not rec.output_name or rec.output_name == self.user_output_name:
                continue
            if self.samples is not None:  # its trainer is gone: what it sampled is final
                self.samples.settle(rec.output_name, rec.offset, ended=True)
            for prefix in _names(rec.output_name):
                for path in sorted(self.output_dir.glob(f"{glob.escape(prefix)}[-.]*")):
                    if self.ledger.step_of(path) is None:
                        self.publisher.set_aside(path, f"attempt {rec.attempt}'s own save, left incomplete")

    def _plan(self, rec: AttemptRecord) -> AttemptSaves:
        """The step saves of an attempt, from what the ledger knows of it (or of the one before)."""
        offset, per_epoch = rec.offset, self.per_epoch()
        if offset is None and per_epoch is not None:
            prior = next((a for a in reversed(self.ledger.attempts) if _note_int(a, BATCHES)), None)
            if prior is not None:
                offset = label_offset(rec.resume_step, True, _note_int(prior, BATCHES) or 0,
                                      _note_int(prior, GRAD_ACCUM) or 1)
        c = self.cadence
        if offset is None or not c.max_steps:
            return AttemptSaves(0, c.every_steps, frozenset(), None)  # unknown: the user's cadence, as given
        # Saved at or before the newest state the ledger knows: what the output dir shows needs no save.
        proven = max([s.step for s in self.ledger.states], default=0)
        saves_done = frozenset(s for s in save_steps(rec.resume_step, proven, c.every_steps) if self._shows_save(s))
        sample_every, samples_done = None, frozenset[int]()
        if self.samples is not None and not self.samples.cadence.every_epochs:  # else kohya samples by epoch
            sample_every = self.samples.cadence.every_steps
            samples_done = frozenset(s for s in self.samples.steps_shown() if s <= proven)
        return attempt_saves(offset, rec.resume_step, c.max_steps, per_epoch, c.every_steps, saves_done=saves_done,
                             sample_every=sample_every, samples_done=samples_done, epoch_states=c.epoch_states,
                             overshoots=self.dialect.overshoots)

    def _check(self, path: Path, scaler: bool | None = None) -> StateCheck:
        """Whether a state is complete, by this trainer's files (``scaler`` None: as the run needs)."""
        return check_state(path, self.need_scaler if scaler is None else scaler, self.dialect, self.processes)

    def _label(self, check: StateCheck, kind: str, number: int | None) -> int | None:
        """The trainer's label of a complete state: its train_state.json's, else (a trainer that writes
        none) its name's step, an epoch's end in the attempt's own count, or the last step."""
        if check.label_step is not None or kind == "step":
            return check.label_step
        offset, per_epoch = self._offset(), self.per_epoch()
        if kind == "epoch":
            return (number or 0) * per_epoch if per_epoch else None
        return self.cadence.max_steps - offset if offset is not None and self.cadence.max_steps else None

    def _shows_save(self, step: int) -> bool:
        """Whether the output dir shows this step's save, complete, under its true name."""
        user = self.user_output_name
        weights = self.output_dir / self._weights_name(user, "step", step)
        state = self.output_dir / self._state_name(user, "step", step)
        whole = check_safetensors(weights) == "" if weights.suffix == ".safetensors" else weights.is_file()
        return whole and self._check(state).ok

    def _offset(self) -> int | None:
        try:
            return self.ledger.attempt(self.attempt).offset
        except KeyError:
            return None

    def summary(self, batches_per_epoch: int | None, grad_accum: int | None) -> None:
        """Fix the attempt's label offset from the start-up summary, and with it where its saves land
        and where to stop it (kohya never trains past the last step: trainsup stops it there)."""
        rec = self.ledger.attempt(self.attempt)
        if not batches_per_epoch or rec.notes.get(BATCHES) is not None:
            return
        ga = grad_accum or 1
        rec.notes.update({BATCHES: batches_per_epoch, GRAD_ACCUM: ga})
        if rec.offset is None:
            rec.offset = label_offset(rec.resume_step, skips(rec), batches_per_epoch, ga)
        self.ledger.save()
        self.saves = self._plan(rec)

    def written_this_attempt(self, path: Path) -> bool:
        try:
            # whole seconds: some file systems keep coarse mtimes
            return path.stat().st_mtime >= int(self.attempt_started)
        except OSError:
            return False

    def final_written(self) -> bool:
        return self.written_this_attempt(self.output_dir / final_weights_name(self.output_name))

    def collect(self, only: Path | None = None) -> list[StateRecord]:
        """Enter this attempt's complete states in the ledger (disk is the truth, lines are hints)."""
        names = _names(self.output_name)
        recorded: list[StateRecord] = []
        # In the order they were written (their last file's time): a step state and the epoch's at the
        # same step are claimed as the trainer saved them, whichever output line arrived first.
        found = sorted(state_dirs(self.output_dir, names), key=accelerate.written_at) if only is None else [only]
        for path in found:
            parsed = parse_state_name(path.name)
            if parsed is None or parsed[0] not in names or self.ledger.step_of(path) is not None:
                continue
            if not self.written_this_attempt(path / accelerate.LAST_FILE):
                continue  # a state of an earlier run under the same name: not this attempt's to claim
            check = self._check(path)
            label = self._label(check, parsed[1], parsed[2]) if check.ok else None
            if label is None:
                continue
            state = self.claim(path, label)
            if state is not None:
                recorded.append(state)
                self._settle(state, parsed[1], parsed[2])
                final_moves = parsed[1] == "final" and not self._own_name()  # publish_final moves it
                self.announce(state, "the final save: published under your output name as the run ends"
                              if final_moves else None)
        if self.samples is not None:
            self.samples.settle(self.output_name, self._offset(), ended=False)
        self._relaunch_when_due()
        return recorded

    def _relaunch_when_due(self) -> None:
        """The segment's end is saved: relaunch from it, once what sd-scripts does at that epoch's end
        after the state (its epoch samples) is done too, i.e. once the next epoch has begun."""
        at, per_epoch = self.saves.relaunch_at, self.per_epoch()
        if at is None or not self.segment_end_saved or self.relaunch_at_state or self.run_complete:
            return
        epoch = at // per_epoch if per_epoch else 0
        if self.samples is not None and self.samples.cadence.wants_epoch(epoch) and self.epoch_seen() <= epoch:
            return
        self.relaunch_at_state = True
        self.journal.event("segment_relaunch", step=at, attempt=self.attempt, why=self.saves.why)
        self.say(f"step {at} (the end of epoch {epoch}) is saved: relaunching from it, so that the next "
                 f"attempt's saves and samples land on your steps at little cost ({self.saves.why})")

    # --- what the output dir shows ---------------------------------------------------------------
    def _own_name(self) -> bool:
        return self.output_name == self.user_output_name

    def _weights_name(self, output_name: str | None, kind: str, number: int | None) -> str:
        return save_names(output_name, kind, number, self.cadence.ext)[0]

    def _state_name(self, output_name: str | None, kind: str, number: int | None) -> str:
        return save_names(output_name, kind, number, self.cadence.ext)[1]

    def _settle(self, state: StateRecord, kind: str, number: int | None) -> None:
        """A save was just claimed: publish it under its true name, hide it, or leave it be."""
        if kind == "final":
            return  # the final save is published when the run finishes
        true_number = state.step if kind == "step" else number
        if kind == "epoch" and self.dialect.epochs_restart:
            # Its epochs count from the resume point: a true epoch only where that is one's end.
            per_epoch = self.per_epoch()
            true_number = state.step // per_epoch if per_epoch and epoch_aligned(state.step, per_epoch) else None
        user_sees = (state.step in self.saves.wanted or self._own_name()) if kind == "step" else \
            true_number is not None and self._user_epoch(true_number)
        state_path = Path(state.dir)
        weights = self.output_dir / self._weights_name(self.output_name, kind, number)
        if self._own_name() and user_sees:
            hidden_state, hidden_weights = state_path, weights  # true names already
        else:
            if user_sees:
                user = self.user_output_name
                self.publisher.weights(weights, self._weights_name(user, kind, true_number))
                self.publisher.state(state_path, self._state_name(user, kind, true_number), state.step)
            why = "a save under an attempt's own name" if not self._own_name() else \
                "an epoch state trainsup saves for an exact resume"
            hidden_weights = self.publisher.hide(weights, why) or weights
            moved = self.publisher.hide(state_path, why)
            hidden_state = moved or state_path
            if moved is not None:
                self._prune()
        if state.step == self.saves.relaunch_at and (kind == "epoch" or not self._user_epoch(
                state.step // (self.per_epoch() or state.step))):
            # The segment ends at an epoch's end: exact to resume from, a step state there as well as
            # the epoch's, unless the user's own epoch cadence shows that epoch's save: then that one.
            self.segment_end_saved = True
        if self.saves.stop_at is not None and state.step == self.saves.stop_at:
            self.final_from = (hidden_weights, hidden_state)
            self.run_complete = True
            self.say(f"step {state.step} is saved: the run is complete; stopping the trainer "
                     "(sd-scripts would train on past --max_train_steps after a resume)")

    def _user_epoch(self, epoch: int) -> bool:
        """Whether the user's own epoch cadence shows this epoch's save."""
        every = self.cadence.every_epochs
        return bool(every) and epoch % every == 0  # type: ignore[operator]

    def _prune(self) -> None:
        """Keep ``RUN_DIR/saves/`` small: of the saves trainsup hid (its own, asked for by its own
        cadence), only the newest two at an epoch's end and the newest of all can still be resumed
        from, and those some attempt resumed from tell its story; the others are deleted (a published
        one stays published: its files are hard links)."""
        per_epoch = self.per_epoch()
        hidden = [s for s in self.ledger.states if Path(s.dir).parent == self.publisher.saves]
        if not hidden:
            return
        aligned = sorted({s.step for s in hidden if epoch_aligned(s.step, per_epoch)})[-2:]
        resumed_from = {a.resume_step for a in self.ledger.attempts}  # kept: each attempt's origin
        keep = {max(s.step for s in hidden), *aligned, *resumed_from}
        for state in [s for s in hidden if s.step not in keep]:
            path = Path(state.dir)
            weights = path.with_name(f"{path.name.removesuffix('-state')}.{self.cadence.ext}")
            shutil.rmtree(path, ignore_errors=True)
            weights.unlink(missing_ok=True)
            self.ledger.states.remove(state)
            self.journal.event("save_pruned", dir=str(path), step=state.step)
        self.ledger.save()

    def save_failed(self, label: int) -> None:
        """The state save at this label raised half-way: never resume from what it left."""
        step_name = state_dir_names(self.output_name)[0]
        self.ledger.mark_bad(self.output_dir / f"{step_name}-step{label:08d}-state")

    # --- across attempts -------------------------------------------------------------------------
    def wrote_under(self, output_name: str | None) -> bool:
        """Whether this run already wrote weights or states under that output name."""
        for entry in outputs_under(self.output_dir, output_name):
            try:
                if entry.stat().st_mtime >= self.run_started:
                    return True
            except OSError:
                continue
        return False

    def start_over(self, output_name: str | None, attempt: int) -> None:
        """Move what this run wrote under ``output_name`` into ``RUN_DIR/saves/`` (kept, out of sight): an
        attempt that starts over from the beginning writes the same names again (a script whose states
        cannot resume a run)."""
        for entry in outputs_under(self.output_dir, output_name):
            try:
                ours = entry.stat().st_mtime >= self.run_started
            except OSError:
                continue
            if ours:
                self.publisher.hide(entry, f"written before attempt {attempt} started over from the beginning")

    def adopt(self, path: Path) -> str:
        """Take the user's own ``--resume`` state as a resume point; '' or why it cannot be."""
        check = self._check(path, False)
        if not check.ok or check.label_step is None:
            return check.reason or f"{self.dialect.words} stores no step in a state: only a step state's name tells it"
        self.ledger.states.append(StateRecord(str(path), check.label_step, 0, check.label_step))
        self.journal.event("state_adopted", dir=str(path), step=check.label_step)
        return ""

    def resumable(self, state: StateRecord, max_steps: int | None, plan: Plan | None = None) -> bool:
        """Never a state at ``max_steps`` or past it: kohya refuses ``--initial_step`` >=
        ``--max_train_steps``, so a fault after the last state, before the final weights, resumes one
        state earlier."""
        return max_steps is None or state.step < max_steps

    def usable(self, path: Path, nan_step: int | None) -> bool:
        if not self._check(path, False).ok:
            return False
        if nan_step is not None and has_non_finite(path / "model.safetensors"):
            self.ledger.mark_bad(path)
            return False
        return True

    def publish_final(self) -> str | None:
        """Put the final weights (and state) where the user's command says, when a renamed attempt
        wrote them, or from the last step's save when trainsup stopped the trainer there."""
        user = self.user_output_name
        want = self.output_dir / final_weights_name(user)
        final_state = state_dir_names(user)[2]
        if self.samples is not None:
            self.samples.settle(self.output_name, self._offset(), ended=True)
        if self.final_from is not None:
            weights, state = self.final_from
        elif not self._own_name():
            weights = self.output_dir / final_weights_name(self.output_name)
            state = self.output_dir / state_dir_names(self.output_name)[2]
        else:
            return str(want) if want.exists() else None
        if weights.exists():
            published = self.publisher.weights(weights, want.name)
            if published is not None:
                self.journal.event("final_published", src=str(weights), dst=str(want))
            if state is not None and state.is_dir():
                self.publisher.state(state, final_state, self.cadence.max_steps or self.ledger.step_of(state) or 0)
            if self.final_from is None:
                self.publisher.hide(weights, "the final save of an attempt's own name")
                if state is not None:
                    self.publisher.hide(state, "the final save of an attempt's own name")
            if published is None and not want.exists():
                return None
        return str(want) if want.exists() else None

    def per_epoch(self) -> int | None:
        return ledger_per_epoch(self.ledger)

    def newest(self, nan_step: int | None = None, max_steps: int | None = None, plan: Plan | None = None,
               accept: Callable[[StateRecord], bool] = lambda _state: True) -> StateRecord | None:
        """The newest safe state, or the newest at an epoch's end when it is at most two save
        intervals older: only an epoch's end resumes sd-scripts with the data order and random state
        an uninterrupted run has there. None (a fresh start) counts as the end of epoch 0."""
        best = super().newest(nan_step, max_steps, plan, accept)
        if not self.dialect.exact_at_epoch_end:
            return best  # no state resumes it exactly: the newest loses the least
        per_epoch = self.per_epoch()
        if best is None or per_epoch is None or epoch_aligned(best.step, per_epoch):
            return best
        aligned = super().newest(nan_step, max_steps, plan, lambda s: accept(s) and epoch_aligned(s.step, per_epoch))
        base = aligned.step if aligned is not None else 0
        if best.step - base > 2 * (self.cadence.every_steps or per_epoch):
            self.journal.event("resume_inexact", newest=best.dir, step=best.step, epoch_end=base,
                               reason="the newest epoch end is too far back")
            return best
        self.journal.event("resume_exact", newest=best.dir, step=best.step, epoch_end=base,
                           state=aligned.dir if aligned is not None else None)
        self.say(f"resuming from the end of epoch {base // per_epoch} (step {base}), not from step "
                 f"{best.step} mid-epoch: only there does sd-scripts resume with the same data order")
        return aligned
