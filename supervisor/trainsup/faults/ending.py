"""Owns the shapes of a failure that no rule names, and the reads every line gets besides the rules.

The rules name faults by their wording.  A log also ends in failures no rule knows, and those must
never read as a healthy run: the scanner records them as ``unknown`` evidence that carries its line
(``verdict``'s ``ending`` kind), so a person sees what ended the run:

- an exception line, with or without its ``Traceback (most recent call last)`` header, cut, glued,
  rank-prefixed or under a rich box: ``module.SomeError: message``, ``KeyboardInterrupt``
  (``EXCEPTION``); a launcher's report of its child (accelerate's ``CalledProcessError``,
  torchrun's ``ChildFailedError``, ``mp.spawn``'s ``ProcessRaisedException``) is not one;
- a signal death a shell or the interpreter reported: ``Segmentation fault (core dumped)``,
  ``Aborted (core dumped)``, ``Fatal Python error: ...`` (``SIGNAL_DEATH``).

``LineReads`` reads every line for what has no fixed wording:

- a NaN loss in any progress or metrics shape that names a loss (``{'loss': nan, ...}``,
  ``iter 30: loss nan,``, ``id_loss: nan;``, ``loss: tensor(nan``, ``│ train_loss │ nan │``, an
  ai-toolkit bar's ``loss: nan]``), and in a notebook's ``Step  Training Loss`` table a row that
  reads nan: evidence for the ``nan_loss`` rule;
- a metric line that names a finite loss: progress, which drops evidence training outlived (see
  ``verdict``);
- the last lines, for an ``unknown`` failure that printed no exception at all.

Every read is gated by a substring test, so ordinary lines cost a few hundred nanoseconds.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence

from .rules import FaultRule
from .verdict import Evidence, Held

__all__ = ["EXCEPTION", "LAUNCHER_EXCEPTIONS", "SIGNAL_DEATH", "UNKNOWN_WHY", "LineReads", "crash", "ending", "wanted"]

UNKNOWN_WHY = "The run failed, and no rule matched its output."
EXCEPTION = re.compile(
    r"^(?:[A-Za-z_]\w*\.){0,6}(?P<type>[A-Za-z_]\w*(?:Error|Exception|Interrupt|Failure))(?::(?:\s|$)|$)")
# Launchers re-raising their child's failure: the child's own exception (before or after) is the one.
LAUNCHER_EXCEPTIONS = frozenset({"CalledProcessError", "ChildFailedError", "ProcessRaisedException",
                                 "ProcessExitedException"})
SIGNAL_DEATH = re.compile(
    r"(?:^|\s)(?:Segmentation fault|Floating point exception|Illegal instruction)(?: \(core dumped\))?$"
    r"|(?:^|\s)(?:Aborted|Bus error) \(core dumped\)$|^(?:Aborted|Bus error)$|^Fatal Python error: \w")
# A loss named, then nan: the separators a progress bar, a dict, a logger, a table or a summary prints.
_SEP = r"[\w/.\]\[-]{0,40}?['\"]?\)?[ \t]*(?:[:=|\u2502,][ \t]*|[ \t])['\"]?(?:tensor\()?[-+]?"
_LOSS_NAN = re.compile(r"(?i:loss)" + _SEP + r"(?:nan|NaN|NAN)\b|(?i:\bloss (?:is|was|became|becomes) nan\b)")
_LOSS_VALUE = re.compile(r"(?i:loss)" + _SEP + r"\d")
# A notebook's training table (transformers' notebook callback, copied as text): its header names a
# loss column; each row is a step and numbers.
_TABLE_HEAD = re.compile(r"^(?:Step|Epoch)\s+(?:Training |Train |Validation )?Loss\b")
_TABLE_ROW = re.compile(r"^\d+(?:\s+(?:[-+]?\d[\d.eE+-]*|nan|NaN|inf|No log))+$")
_LAST_LINES = 5


def wanted(text: str) -> bool:
    """Whether ``LineReads.read`` may find anything in ``text`` outside a loss table (the scanner
    remembers the answer with the line's cleaning)."""
    return "nan" in text or "NaN" in text or "NAN" in text or "oss" in text or text.startswith(("Step", "Epoch"))


def ending(raw: str, lineno: int, since: int) -> Evidence:
    """The ``unknown`` evidence of an exception line or a signal death no rule names."""
    return Evidence("unknown", raw, lineno, "weak", kind="ending", since=since, explanation=UNKNOWN_WHY)


def crash(raw: str, lineno: int, signal: int) -> Evidence:
    """The ``unknown`` evidence of a launcher's report that a process crashed (``exits.CRASH_SIGNALS``)."""
    name = _SIGNAL_NAMES.get(signal, f"signal {signal}")
    return Evidence("unknown", raw, lineno, "weak", kind="ending", since=lineno,
                    explanation=f"A process of the run crashed ({name}, signal {signal}) in native code: a CUDA "
                    "kernel, the driver or a compiled extension. It printed no Python traceback; the other "
                    "ranks' failed collectives came after it and are not the cause.")


_SIGNAL_NAMES = {4: "SIGILL", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}


class LineReads:
    """The reads every cleaned line gets besides the rule table (see the module doc)."""

    def __init__(self, rules: Sequence[FaultRule], held: Held) -> None:
        nan = next((r for r in rules if r.id == "nan_loss"), None)
        self._nan_why = nan.explanation if nan is not None else None  # no NaN rule: no NaN reads
        self._held = held
        self.table = False  # inside a loss table (every line is then read)
        self.last_lines: deque[tuple[str, int]] = deque(maxlen=_LAST_LINES)

    def read(self, text: str, raw: str, lineno: int) -> Evidence | None:
        """Read one non-empty line the scanner found ``wanted`` (or any, inside a loss table); returns NaN
        evidence, else None (progress goes to the held verdict).  The scanner keeps ``last_lines``."""
        if self.table or text.startswith(("Step", "Epoch")):
            found = self._read_table(text, raw, lineno)
            if found is not None:
                return found
        if ("nan" in text or "NaN" in text or "NAN" in text) and self._nan_why is not None \
                and _LOSS_NAN.search(text) is not None:
            return Evidence("nan_loss", raw, lineno, "root", explanation=self._nan_why)
        if "oss" in text and "%|" not in text and _LOSS_VALUE.search(text) is not None:
            self._held.metric()
        return None

    def _read_table(self, text: str, raw: str, lineno: int) -> Evidence | None:
        if _TABLE_HEAD.match(text) is not None:
            self.table = True
            return None
        if not self.table:
            return None
        if _TABLE_ROW.match(text) is None:
            self.table = False
            return None
        if ("nan" in text or "NaN" in text) and self._nan_why is not None:
            return Evidence("nan_loss", raw, lineno, "root", explanation=self._nan_why)
        self._held.metric()  # a row with a finite loss: training went on
        return None
