"""Owns the value types the command line's options take (argparse ``type=``): each refuses a bad value
with a message that names what was expected and what was given, which argparse prints as its error."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def at_least_one(what: str = "an integer") -> Callable[[str], int]:
    """An integer >= 1 (``--slots``, ``--to``, ``--lead``; ``--attempt`` says "an attempt number")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected {what} >= 1, got {text!r}")
        return value

    return parse


def seconds(text: str) -> float:
    """Seconds >= 0, finite (``--timeout``)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value
