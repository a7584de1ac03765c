"""The step cadence of a resumed sd-scripts attempt: its saves (and step samples) must land on the
user's true steps, and cost at most one state more an epoch, never one a step, where the wanted
labels allow (a segment up to an epoch's end, relaunched from its state)."""

from __future__ import annotations

import math

import pytest

from trainsup.adapters.kohya.exact import attempt_saves, epoch_aligned, label_cadence, save_steps, trains_past


def simulate(resume: int, max_steps: int, per_epoch: int, every: int | None, done: set[int] | None = None,
             sample_every: int | None = None, samples_done: set[int] | None = None,
             epoch_states: bool = True) -> tuple[list[int], list[int], list[int]]:
    """What sd-scripts writes under the attempts trainsup launches one after another from ``resume``:
    (the absolute steps of every state written, of every step sample, each attempt's resume step).
    Each attempt saves a step where its label is a multiple of its cadence, a state at every epoch's
    end but the last (``--save_every_n_epochs 1``) and is stopped once the state it ends at is complete;
    the wanted saves and samples it made are shown from then on, as trainsup publishes them."""
    done, samples_done = set(done or ()), set(samples_done or ())
    states: list[int] = []
    samples: list[int] = []
    starts: list[int] = []
    k = resume
    last_epoch_end = math.ceil(max_steps / per_epoch) * per_epoch
    while k < max_steps:
        starts.append(k)
        assert len(starts) < 20, starts
        plan = attempt_saves(k, k, max_steps, per_epoch, every, saves_done=frozenset(done),
                             sample_every=sample_every, samples_done=frozenset(samples_done),
                             epoch_states=epoch_states)
        end = plan.relaunch_at or plan.stop_at or max_steps
        for step in range(k + 1, (plan.relaunch_at or plan.stop_at or last_epoch_end) + 1):
            label = step - k
            if plan.sample_every and label % plan.sample_every == 0:
                samples.append(step)
            step_save = bool(plan.every) and label % plan.every == 0  # type: ignore[operator]
            if step_save:
                states.append(step)
            if step == end and plan.relaunch_at is not None and step_save:
                break  # a step state at the segment's end is an exact resume point: no epoch state
            if epoch_states and step % per_epoch == 0 and step < last_epoch_end:
                states.append(step)
        done |= {s for s in states if s in plan.wanted}
        samples_done |= {s for s in samples if sample_every and s % sample_every == 0}
        k = end
    return states, samples, starts


def uninterrupted(resume: int, max_steps: int, per_epoch: int, every: int | None) -> list[int]:
    """The states an uninterrupted run (under trainsup: a state at every epoch's end but the last)
    writes after ``resume``: its step saves and its epoch states (both, where they fall together)."""
    return sorted([*save_steps(resume, max_steps, every), *range(resume + per_epoch, max_steps, per_epoch)])


def test_the_beds_kill_after_the_state_of_10_writes_the_states_of_15_16_and_20_only() -> None:
    # 8 steps an epoch, a save every 5, 20 steps, killed after the state of step 10, resumed at the end
    # of epoch 1 (step 8). One cadence for steps 15 and 20 would be their labels' gcd, 1: a state at
    # every step. Instead the attempt goes to step 16 saving every 7 labels (step 15), and is
    # relaunched from the state of step 16, saving every 4 (step 20), where it is stopped.
    first = attempt_saves(8, 8, 20, 8, 5, saves_done=frozenset({10}))
    assert (first.every, first.wanted, first.stop_at, first.relaunch_at) == (7, frozenset({15, 20}), None, 16)
    assert "12 step saves for 2" in first.why
    second = attempt_saves(16, 16, 20, 8, 5, saves_done=frozenset({10, 15}))
    assert (second.every, second.wanted, second.stop_at, second.relaunch_at) == (4, frozenset({20}), 20, None)
    states, _, starts = simulate(8, 20, 8, 5, done={10})
    assert states == [15, 16, 20] and starts == [8, 16]
    # An uninterrupted run writes 10, 15, 16 and 20 after step 8: the resumed attempts write fewer.
    assert uninterrupted(8, 20, 8, 5) == [10, 15, 16, 20]


def test_a_state_of_10_cut_mid_save_is_saved_again_and_the_epoch_is_one_segment() -> None:
    # Steps 10 and 15 are labels 2 and 7 of the same epoch: no cadence but 1 hits both. The segment
    # keeps that to the epoch (8 states, the last one at its end, relaunched from), not the run (12).
    states, _, starts = simulate(8, 20, 8, 5)
    assert states == [9, 10, 11, 12, 13, 14, 15, 16, 20] and starts == [8, 16]


@pytest.mark.parametrize(("resume", "max_steps", "per_epoch", "every"), [
    (8, 20, 8, 5), (16, 20, 8, 5), (8, 24, 8, 6), (10, 40, 10, 10), (8, 20, 8, None), (100, 1000, 100, 250),
    (100, 1000, 100, 30), (200, 2000, 200, 500), (24, 100, 8, 5), (4, 40, 4, 4),
])
def test_every_true_save_step_is_saved_and_the_run_ends_at_its_last_step(
        resume: int, max_steps: int, per_epoch: int, every: int | None) -> None:
    states, _, starts = simulate(resume, max_steps, per_epoch, every)
    assert set(save_steps(resume, max_steps, every)) <= set(states)
    assert max(states) == max_steps or max_steps % per_epoch == 0  # whole epochs: it ends by itself
    assert all(epoch_aligned(s, per_epoch) for s in starts[1:])  # every relaunch is an exact resume point
    clean = len(uninterrupted(resume, max_steps, per_epoch, every))
    epochs = math.ceil((max_steps - resume) / per_epoch)
    print(f"resume {resume}, {per_epoch} an epoch, every {every}: {len(states)} states ({clean} uninterrupted), "
          f"{len(starts)} attempts")
    assert len(states) < max_steps - resume or max_steps - resume <= 2 * per_epoch  # never one a step
    if every is None or every >= per_epoch:
        # At most one wanted save an epoch: at most one state more an epoch than the uninterrupted run.
        assert len(states) <= clean + epochs, (states, clean)


@pytest.mark.parametrize(("offset", "max_steps", "per_epoch", "every", "want_every", "stop_at"), [
    (16, 20, 8, 5, 4, 20),     # only step 20 is left: one save, 4 labels on
    (16, 24, 8, 6, 2, None),   # whole epochs: it ends by itself at 24; saves at 18, 24 = labels 2, 8
    (10, 40, 10, 10, 10, None),  # the offset is a multiple of the cadence: the user's own cadence
    (8, 20, 8, None, 12, 20),  # no step cadence: one save at the last step, to stop there
    (0, 20, 8, 5, 5, None),    # a fresh start under an attempt's own name counts true steps
])
def test_one_cadence_for_the_rest_of_the_run_where_it_costs_little(
        offset: int, max_steps: int, per_epoch: int, every: int | None, want_every: int, stop_at: int | None) -> None:
    saves = attempt_saves(offset, offset, max_steps, per_epoch, every)
    assert (saves.every, saves.stop_at, saves.relaunch_at) == (want_every, stop_at, None)
    labels_saved = {label for label in range(1, 100) if label % want_every == 0}
    assert {step - offset for step in saves.wanted} <= labels_saved
    if stop_at is not None:
        assert stop_at - offset in labels_saved


def test_samples_every_10_over_40_steps_land_on_10_20_30_40() -> None:
    # 4 steps an epoch, a save every 4, a sample every 10, killed after the state of step 12 (its
    # sample of step 10 shown): one sample cadence from 12 would be 2 (labels 8, 18, 28).
    plan = attempt_saves(12, 12, 40, 4, 4, sample_every=10, samples_done=frozenset({10}))
    assert (plan.every, plan.sample_every, plan.relaunch_at) == (4, 8, 28)
    states, samples, starts = simulate(12, 40, 4, 4, sample_every=10, samples_done={10})
    assert {10, 20, 30, 40} - {10} <= set(samples) and starts == [12, 28]
    assert samples == [20, 28, 30, 32, 34, 36, 38, 40]
    assert set(range(16, 41, 4)) <= set(states)
    # No sample wanted in a segment: its step samples are off (0), never the command's own cadence.
    assert attempt_saves(12, 12, 40, 4, 4, sample_every=100).sample_every == 0
    assert attempt_saves(12, 12, 40, 4, 4).sample_every is None  # a command that samples by steps only


def test_without_epoch_states_a_segment_ends_at_a_step_state() -> None:
    plan = attempt_saves(8, 8, 20, 8, 5, saves_done=frozenset({10}), epoch_states=False)
    assert plan.relaunch_at == 16 and plan.every == 1  # labels 7 (step 15) and 8 (step 16)
    states, _, _ = simulate(8, 20, 8, 5, done={10}, epoch_states=False)
    assert 16 in states and 20 in states and 15 in states


def test_arithmetic_helpers() -> None:
    assert save_steps(8, 20, 5) == frozenset({10, 15, 20}) and save_steps(8, 20, None) == frozenset()
    assert trains_past(8, 20, 8) == 4 and trains_past(0, 20, 8) == 0 and trains_past(8, 24, 8) == 0
    assert epoch_aligned(16, 8) and not epoch_aligned(12, 8) and not epoch_aligned(16, None) and not epoch_aligned(0, 8)
    assert label_cadence([10, 15, 20], 8) == 1 and label_cadence([15], 8) == 7 and label_cadence([], 8) is None
