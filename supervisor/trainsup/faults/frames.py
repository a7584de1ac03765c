"""Owns judging a traceback by the frames it shows, when its exception line is missing or says too little.

People paste tracebacks cut before their exception line, or with a message that names no fault
(``TypeError: cannot unpack non-iterable NoneType object``).  The frames still tell where it
failed: a ``None`` in the trainer's sampling or text-encoding code is a text-encoder cache miss;
a failure in ``save_state``/``save_file`` with a float8 dtype in sight is the old serializer.

A rule says so with ``FaultRule.cut_frames`` (regexes over ``"<file basename> <function>"``, as
the scanner records frames) and ``cut_hints``: wording that must be in sight, a few lines before
or after the frames (a message, or the code the innermost frame quotes); a rule without hints is judged
by its frames alone.  The code an outer frame quotes describes that frame's call, never the exception
(``_get_hidden_states_sdxl`` passes ``input_ids2`` on to ``_pool_workaround``, which failed): a hint
there is *pending* until the traceback shows no deeper frame (the scanner settles it), and it never
confirms the frames that follow.  ``judge`` looks at the frames innermost first: a frame in ``frames_exclude``
refutes (a ``None`` in a dataset or a model loader is a different bug), a required one confirms.
The scanner ranks what these find below a traceback's own exception line (see ``scanner``): a
real exception line, when there is one, names the fault better than the frames around it.

Launcher frames are recognised here too: an exception raised in accelerate's or torchrun's
launcher (``simple_launcher``, ``launch_agent``) is their report of the trainer's failure, never
its cause, so it does not count as a traceback's exception line.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .verdict import Evidence

if TYPE_CHECKING:
    from .rules import FaultRule

__all__ = ["CutRule", "FrameJudge", "cut_rules", "framed", "is_launcher", "judge"]

_LAUNCHER = re.compile(
    r"^(?:launch\.py (?:\w*_launcher|launch_command)|api\.py (?:launch_agent|_invoke_run)"
    r"|subprocess\.py (?:check_call|check_output|run)|multiprocessing\.py (?:_raise_.*|start_processes))$"
)
# How far (lines) a hint may be from the frames it confirms: a GUI may print the message before
# the traceback, interleaved ranks push it further away.
HINT_BEFORE, HINT_AFTER = 60, 40
Found = tuple["CutRule", str, int]  # (the rule, the line as written, its line number)


class CutRule:
    """The cut-traceback side of a ``FaultRule``, compiled: its frames, excluded frames and hint."""

    def __init__(self, rule: FaultRule) -> None:
        self.id = rule.id
        self.explanation = rule.explanation
        self.require = tuple(re.compile(p) for p in rule.cut_frames)
        self.exclude = tuple(re.compile(p) for p in rule.frames_exclude)
        self.forbid = tuple(re.compile(p) for p in rule.frames_forbid)
        self.hint = re.compile("|".join(f"(?:{h})" for h in rule.cut_hints)) if rule.cut_hints else None


def cut_rules(rules: Sequence[FaultRule]) -> tuple[CutRule, ...]:
    """The rules that can judge a traceback by its frames, in table order."""
    return tuple(CutRule(r) for r in rules if r.cut_frames)


def judge(frames: Sequence[str], require: Sequence[re.Pattern[str]],
          exclude: Sequence[re.Pattern[str]] = (), forbid: Sequence[re.Pattern[str]] = ()) -> bool | None:
    """Innermost frame first: False at an excluded frame, True at a required one, None for neither;
    False whenever any frame is a forbidden one."""
    if forbid and any(x.search(frame) for frame in frames for x in forbid):
        return False
    for frame in reversed(frames):
        if any(x.search(frame) for x in exclude):
            return False
        if any(x.search(frame) for x in require):
            return True
    return None


def is_launcher(frames: Sequence[str]) -> bool:
    """Whether the innermost frame is a launcher's (accelerate, torchrun, subprocess) reporting its child."""
    return bool(frames) and _LAUNCHER.match(frames[-1]) is not None


class FrameJudge:
    """The hints seen lately, and the judgement of frames by them (the scanner feeds both)."""

    def __init__(self, rules: Sequence[CutRule]) -> None:
        self._rules = rules
        self._bare = tuple(r for r in rules if r.hint is None)  # judged by their frames alone
        self._hints: deque[tuple[int, int, str, str]] = deque(maxlen=16)  # (lineno, rule, rank, raw)
        self.pending: tuple[Found, str] | None = None  # judged by a hint in quoted code, and its rank

    def hint(self, j: int, lineno: int, rank: str, raw: str,
             frames_by_rank: Mapping[str, tuple[int, list[str]]], code: bool = False) -> Found | None:
        """Rule ``j``'s hint on a line: remember it, and judge the newest frames before it (its rank's first).

        A hint in the code a frame quotes (``code``) judges its rank's frames as they stand, and only
        as ``pending``: a deeper frame after it withdraws it (see ``frame``)."""
        if code:
            frames = frames_by_rank.get(rank, (0, []))[1]
            rule = self._rules[j]
            first = self.pending is None or self.pending[0][2] != lineno  # (the first rule of a line wins)
            if first and frames and judge(frames, rule.require, rule.exclude, rule.forbid):
                self.pending = ((rule, raw, lineno), rank)
            return None
        self._hints.append((lineno, j, rank, raw))
        near = [(r, f) for r, f in frames_by_rank.items() if f[1] and lineno - f[0] <= HINT_AFTER]
        if not near:
            return None
        _, (_, frames) = min(near, key=lambda rf: (rf[0] != rank, -rf[1][0]))
        rule = self._rules[j]
        return (rule, raw, lineno) if judge(frames, rule.require, rule.exclude, rule.forbid) else None

    def frame(self, frames: list[str], rank: str, lineno: int, raw: str) -> Found | None:
        """A traceback grew a frame: judge it by the hints seen shortly before (its rank's first)."""
        if self.pending is not None and self.pending[1] == rank:
            self.pending = None  # the code it was seen in was an outer frame's
        for rule in self._bare:
            if judge(frames, rule.require, rule.exclude, rule.forbid):
                return rule, raw, lineno
        if not self._hints:
            return None
        for hint_line, j, _, hint_raw in sorted(self._hints, key=lambda h: (h[2] != rank, -h[0])):
            if lineno - hint_line > HINT_BEFORE + 3 * len(frames):
                continue
            rule = self._rules[j]
            if judge(frames, rule.require, rule.exclude, rule.forbid):
                return rule, hint_raw, hint_line
        return None


def framed(found: Found | None) -> Evidence | None:
    """The evidence of a traceback a cut rule judged by its frames."""
    if found is None:
        return None
    rule, line, lineno = found
    return Evidence(rule.id, line, lineno, "root", framed=True, explanation=rule.explanation)
