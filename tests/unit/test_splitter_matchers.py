"""Line splitting and the progress/bookkeeping matchers."""

from trainsup.adapters.kohya import output as matchers  # the line formats are kohya's own
from trainsup.faults.splitter import LineSplitter


def test_splits_on_cr_and_lf_and_keeps_the_partial_tail() -> None:
    s = LineSplitter()
    assert s.feed(b"steps:  10%|\r") == ["steps:  10%|"]
    assert s.feed(b"abc") == []
    assert s.feed(b"def\r\nnext\n") == ["abcdef", "next"]
    assert s.feed(b"tail") == [] and s.flush() == ["tail"]


def test_endless_line_is_capped_and_the_rest_dropped_until_a_break() -> None:
    s = LineSplitter(max_line=10)
    out = s.feed(b"x" * 25)
    assert out == ["x" * 10] and s.pending_bytes == 0
    assert s.feed(b"y" * 100) == []  # still the same overlong line
    assert s.feed(b"zz\nok\n") == ["ok"]
    assert s.truncated_lines == 1


def test_binary_garbage_decodes_without_error() -> None:
    s = LineSplitter()
    assert s.feed(b"\xff\xfe\x00bad\n") == ["\ufffd\ufffd\x00bad"]


def test_progress_bar_parsing() -> None:
    p = matchers.parse_progress("steps:  10%|█         | 2/20 [00:01<00:09,  1.20it/s, avr_loss=0.123]")
    assert p == matchers.Progress(2, 20, 1.2, 0.123)
    slow = matchers.parse_progress("steps:  50%|#####     | 10/20 [00:10<00:10,  2.50s/it, avr_loss=nan]")
    assert slow is not None and slow.rate == 0.4 and slow.loss != slow.loss  # NaN
    glued = "steps: 5%|| 1/20 [00:01<?, ?it/s]steps: 10%|| 2/20 [00:02<00:18, 1.00it/s, avr_loss=0.5]"
    assert matchers.parse_progress(glued) == matchers.Progress(2, 20, 1.0, 0.5)
    assert matchers.parse_progress("caching latents: 50%|██ | 4/8 [00:01<00:01]") is None


def test_bookkeeping_lines() -> None:
    assert matchers.state_completed("Random states saved in /o/x-step00000010-state/random_states_0.pkl") \
        == "/o/x-step00000010-state"
    assert matchers.state_started("saving state at step 10") == 10
    assert matchers.is_success("model saved.")
    assert matchers.batches_per_epoch("  num batches per epoch / 1epochのバッチ数: 8") == 8
    assert matchers.grad_accum_steps("  gradient accumulation steps / 勾配を合計するステップ数 = 2") == 2
