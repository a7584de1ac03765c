"""Turning decorated output lines into the bare message the fault rules match."""

from __future__ import annotations

import timeit

import pytest

from trainsup.faults.linetext import bar_tail, clean_line, rank_tag, starts_record, strip_ansi


def test_strip_ansi_removes_colours_cursor_moves_and_hyperlinks() -> None:
    assert strip_ansi("\x1b[1;31mRuntimeError\x1b[0m: boom") == "RuntimeError: boom"
    assert strip_ansi("\x1b[2K\x1b[1Gsteps") == "steps"
    assert strip_ansi("\x1b]8;id=1;file:///x.py\x1b\\x.py\x1b]8;;\x1b\\") == "x.py"
    assert strip_ansi("plain") == "plain"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("[rank0]:RuntimeError: boom", "RuntimeError: boom"),
        ("[rank3]: [default3]: RuntimeError: boom", "RuntimeError: boom"),
        ("[12:01:02] [STDERR] RuntimeError: boom", "RuntimeError: boom"),
        ("[12:01:02] [STDOUT] [rank1]: steps", "steps"),
        ("2024-08-01 12:00:00 ERROR    OSError: x", "OSError: x"),
        ("2024-08-01T12:00:00.123Z stdout F OSError: x", "OSError: x"),
        ("[2024-08-01 12:00:00,123] INFO | train | loaded", "train | loaded"),
        ("2024-08-01 12:00:00.123 | ERROR | OSError: x", "OSError: x"),
        ("ERROR: No space left on device", "No space left on device"),
        ("INFO     loading model", "loading model"),
        ("CRITICAL boom", "boom"),
        ("[08/01/24 12:00:00] WARNING  careful", "careful"),
        ("                    INFO     same second, blank time", "same second, blank time"),
        ("                             a continuation row                 ", "a continuation row"),
    ],
)
def test_clean_line_strips_leading_decoration_in_any_combination(raw: str, expected: str) -> None:
    assert clean_line(raw) == expected


def test_clean_line_drops_richs_source_column_only_after_padding() -> None:
    rich = "2024-08-01 12:00:00 INFO     loading model for process 0/1          train_util.py:4321"
    assert clean_line(rich) == "loading model for process 0/1"
    assert clean_line("see train_network.py:12") == "see train_network.py:12"
    assert clean_line("x  not a file:12") == "x  not a file:12"


def test_clean_line_handles_ansi_around_every_column() -> None:
    raw = ("\x1b[2m2024-08-01 12:00:00\x1b[0m\x1b[2m \x1b[0m\x1b[31mERROR   \x1b[0m CUDA out of memory"
           "          \x1b[2mtrain_util.py\x1b[0m\x1b[2m:\x1b[0m\x1b[2m12\x1b[0m")
    assert clean_line(raw) == "CUDA out of memory"


def test_clean_line_keeps_messages_that_merely_start_with_level_like_words() -> None:
    assert clean_line("INFORMATION follows") == "INFORMATION follows"
    assert clean_line("Errors: 3") == "Errors: 3"
    assert clean_line("  File \"x.py\", line 1, in f") == 'File "x.py", line 1, in f'


def test_bar_tail() -> None:
    bar = "steps:  10%|█         | 2/20 [00:04<00:36,  1.52s/it, avr_loss=0.146]"
    assert bar_tail("loading model") is None
    assert bar_tail(bar) == ""
    assert bar_tail(bar + "Traceback (most recent call last):") == "Traceback (most recent call last):"
    assert bar_tail("steps:  45%|████▌     | 9/20 [00:0RuntimeError: x") == ""


def test_rank_tag() -> None:
    assert rank_tag("[rank3]: x") == "3"
    assert rank_tag("[default1]:x") == "1"
    assert rank_tag("\x1b[0m[rank2]: x") == "2"
    assert rank_tag("no rank here") == ""


def test_starts_record_sees_richs_filled_level_column() -> None:
    assert starts_record("2024-08-01 12:00:00 INFO     loading model                 train_util.py:1")
    assert starts_record("                    ERROR    same second                   train_util.py:2")
    assert not starts_record("                             a continuation row")
    assert not starts_record("Traceback (most recent call last):")


def test_clean_line_is_cheap() -> None:
    # Runs on every line of multi-GB logs; generous bound so a loaded CI box passes.
    line = "2024-08-01 12:00:00 INFO     loading model for process 0/1 from /models/f.safetensors   train_util.py:4321"
    per_call = min(timeit.repeat(lambda: clean_line(line), number=2000, repeat=5)) / 2000
    assert per_call < 20e-6
