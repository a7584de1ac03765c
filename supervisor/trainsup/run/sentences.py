"""Owns how the supervisor's own console lines read: a sentence with the facts, never ``None``.

The journal keeps the same facts as key=value records (``record.journal``); these are for a person
watching the console (``trainsup: attempt 2 ended (exit 1) on a cuda_oom fault: torch.OutOf...``).
A path is shown as the person would type it (``record.textfmt.shown_path``); a line of the trainer's
is shown as its first row, cut at ``EVIDENCE_CHARS``.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from pathlib import Path

from ..faults.scanner import Evidence
from ..record.textfmt import eta_seconds, format_duration, progress_parts, shown_path
from .attempt import AttemptResult
from .runstate import shown_state

__all__ = ["end_sentence", "fault_sentence", "progress_sentence", "remedy_sentence"]

EVIDENCE_CHARS = 200


def _clip(text: str, width: int = EVIDENCE_CHARS) -> str:
    """The text, or its first sentence when it is longer than ``width`` (a torch error's message is
    one sentence, then advice), else its first ``width`` characters."""
    if len(text) <= width:
        return text
    first = text.find(". ", 20, width)
    return text[:first + 1] if first > 0 else text[:width - 1] + "…"


def how_it_ended(exit_code: int | None, sig: int | None) -> str:
    """``exit 1``, ``killed by SIGKILL``, or ``its end unknown``."""
    if sig:
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit {exit_code}" if exit_code is not None else "its end unknown"


def fault_sentence(attempt: int, r: AttemptResult, evidence: Evidence | None, log: Path) -> str:
    """``attempt 2 ended (exit 1) on a cuda_oom fault: torch.OutOfMemoryError: ...``; an unknown fault
    with no line to show says where to read."""
    how = how_it_ended(r.exit_code, r.signal)
    line = _clip(evidence.line.strip().split("\n")[0].strip()) if evidence is not None else ""
    fault = r.fault or "unknown"
    article = "an" if fault[:1] in "aeiou" else "a"
    said = f"attempt {attempt} ended ({how}) on {article} {fault} fault"
    if line:
        return f"{said}: {line}"
    if fault == "unknown":
        return f"{said}: no line of its output says why (see its log, {shown_path(log)})"
    return said


def end_sentence(state: str, exit_code: int, reason: str | None) -> str:
    """How the run ended, as the status and the page word it: ``the run failed: restart budget spent:
    ... (exit 3)``; ``stopped by SIGTERM (exit 143)``."""
    said = reason or "no reason recorded"
    if said.startswith("stopped"):
        return f"{said} (exit {exit_code})"
    return f"the run {shown_state(state, exit_code)}: {said} (exit {exit_code})"


def progress_sentence(attempt: int | None, step: int, total: int | None, loss: float | None,
                      rate: float | None) -> str:
    """``attempt 1: step 120/1600, loss 0.0123, 2.31 it/s, eta 10m40s`` (``--quiet``'s line a minute)."""
    shown_loss = None if loss is None or math.isnan(loss) else loss
    parts = progress_parts(step, total, shown_loss, rate, eta_s=eta_seconds(step, total, rate))
    if loss is not None and math.isnan(loss):
        parts.insert(1, "loss NaN")
    return (f"attempt {attempt}: " if attempt is not None else "") + ", ".join(parts)


def remedy_sentence(fault: str, rung_index: int | None, actions: Sequence[str], next_attempt: int,
                    delay_s: float) -> str:
    """``cuda_oom, remedy 1: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; attempt 3 starts in 2 s``."""
    rung = f", remedy {rung_index + 1}" if rung_index is not None else ""
    done = "; ".join(actions) if actions else "the same command again"
    when = f"in {format_duration(delay_s)}" if delay_s >= 1 else "now"
    return f"{fault}{rung}: {done}; attempt {next_attempt} starts {when}"
