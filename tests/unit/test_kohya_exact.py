"""The step cadence of a resumed sd-scripts attempt: its saves must land on the user's true steps."""

from __future__ import annotations

import pytest

from trainsup.trainers.kohya.exact import attempt_saves, epoch_aligned, save_steps, trains_past


def test_the_beds_case_resumed_at_the_end_of_epoch_1_saves_every_step_and_stops_at_20() -> None:
    # 8 steps an epoch, a save every 5, 20 steps: labels run 8 behind, so steps 10, 15 and 20 are
    # labels 2, 7 and 12 (gcd 1), and sd-scripts would train on to step 24.
    saves = attempt_saves(offset=8, resume_step=8, max_steps=20, per_epoch=8, user_every=5)
    assert (saves.every, saves.wanted, saves.stop_at) == (1, frozenset({10, 15, 20}), 20)


@pytest.mark.parametrize(("offset", "max_steps", "per_epoch", "every", "want_every", "stop_at"), [
    (16, 20, 8, 5, 4, 20),     # only step 20 is left: one save, 4 labels on
    (8, 24, 8, 6, 2, None),    # whole epochs: it ends by itself at 24; saves at 12, 18, 24 = labels 4, 10, 16
    (10, 40, 10, 10, 10, None),  # the offset is a multiple of the cadence: the user's own cadence
    (8, 20, 8, None, 12, 20),  # no step cadence: one save at the last step, to stop there
    (0, 20, 8, 5, 5, None),    # a fresh start under an attempt's own name counts true steps
])
def test_every_true_save_step_is_a_label_multiple(offset: int, max_steps: int, per_epoch: int, every: int | None,
                                                  want_every: int, stop_at: int | None) -> None:
    saves = attempt_saves(offset, offset, max_steps, per_epoch, every)
    assert (saves.every, saves.stop_at) == (want_every, stop_at)
    labels_saved = {label for label in range(1, 100) if label % want_every == 0}
    assert {step - offset for step in saves.wanted} <= labels_saved
    if stop_at is not None:
        assert stop_at - offset in labels_saved


def test_arithmetic_helpers() -> None:
    assert save_steps(8, 20, 5) == frozenset({10, 15, 20}) and save_steps(8, 20, None) == frozenset()
    assert trains_past(8, 20, 8) == 4 and trains_past(0, 20, 8) == 0 and trains_past(8, 24, 8) == 0
    assert epoch_aligned(16, 8) and not epoch_aligned(12, 8) and not epoch_aligned(16, None) and not epoch_aligned(0, 8)
