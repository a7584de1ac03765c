"""Owns judging a traceback by the frames it shows, when its exception line is missing or says too little.

People paste tracebacks cut before their exception line, or with a message that names no fault
(``TypeError: cannot unpack non-iterable NoneType object``).  The frames still tell where it
failed: a ``None`` in the trainer's sampling or text-encoding code is a text-encoder cache miss;
a failure in ``save_state``/``save_file`` with a float8 dtype in sight is the old serializer.

A ``FrameRule`` pairs the frames (regexes over ``"<file basename> <function>"``, as the scanner
records them) with a *hint*: wording that must be in sight, a few lines before or after the frames.
``judge`` looks at the frames innermost first: an excluded frame refutes (a ``None`` in a dataset
or a model loader is a different bug), a required one confirms.  The scanner holds what a frame
rule finds below a traceback's own exception line (see ``scanner``): a real exception line, when
there is one, names the fault better than the frames around it.

Launcher frames are recognised here too: an exception raised in accelerate's or torchrun's
launcher (``simple_launcher``, ``launch_agent``) is their report of the trainer's failure, never
its cause, so it does not count as a traceback's exception line.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["FRAME_RULES", "SAMPLING_FRAMES", "CompiledFrameRule", "FrameJudge", "FrameRule", "is_launcher", "judge"]

# The trainer's sampling and text-encoding functions (sd-scripts, its Flux/SD3 strategies, fluxgym's and
# ComfyUI's copies): a None there is a prompt without a cached text-encoder output.
SAMPLING_FRAMES: tuple[str, ...] = (
    r"sample", r"prompt", r"get_text_cond", r"text_encod",
    r"te_outputs", r"get_hidden_states",
)
# Code that loads data or models: a None there is a missing image, caption or weight.
LOADER_FRAMES: tuple[str, ...] = (r"__getitem__", r"(?<![a-z])load_", r"[Dd]ataset", r"[Dd]ata[Ll]oader")
_LAUNCHER = re.compile(
    r"^(?:launch\.py (?:\w*_launcher|launch_command)|api\.py (?:launch_agent|_invoke_run)"
    r"|subprocess\.py (?:check_call|check_output|run)|multiprocessing\.py (?:_raise_.*|start_processes))$"
)
# How far (lines) a hint may be from the frames it confirms: a GUI may print the message before
# the traceback, interleaved ranks push it further away.
HINT_BEFORE, HINT_AFTER = 60, 40
Found = tuple[str, str, int]  # (fault id, the hint's line as written, its line number)


@dataclass(frozen=True)
class FrameRule:
    """A fault told by the frames of a traceback and a hint in sight."""

    id: str
    frames: tuple[str, ...]
    hint: str  # one regex; every hint carries a literal the scanner's prefilter keys on
    frames_exclude: tuple[str, ...] = ()


FRAME_RULES: tuple[FrameRule, ...] = (
    FrameRule(
        id="te_cache_none",
        frames=SAMPLING_FRAMES,
        # a None in sight: a message, a printed tuple of text-encoder outputs with holes, or the code of a
        # frame reading the cache (a traceback cut before its exception line shows only that)
        hint=r"NoneType|\bNone, None\b|sample_prompts_te_outputs|\binput_ids2\b",
        frames_exclude=LOADER_FRAMES,
    ),
    FrameRule(
        id="fp8_serializer",
        frames=(r" save_state$", r" save_file$", r" save_weights$", r" save_model(?:_hook)?$", r" _flatten$",
                r" _tobytes$", r"^safetensors"),
        hint=r"float8_e[45]m|F8_E[45]M",
    ),
)


class CompiledFrameRule:
    """A ``FrameRule`` with its regexes compiled."""

    def __init__(self, rule: FrameRule) -> None:
        self.rule = rule
        self.require = tuple(re.compile(p) for p in rule.frames)
        self.exclude = tuple(re.compile(p) for p in rule.frames_exclude)
        self.hint = re.compile(rule.hint)


def judge(frames: Sequence[str], require: Sequence[re.Pattern[str]],
          exclude: Sequence[re.Pattern[str]] = ()) -> bool | None:
    """Innermost frame first: False at an excluded frame, True at a required one, None for neither."""
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

    def __init__(self, rules: Sequence[CompiledFrameRule]) -> None:
        self._rules = rules
        self._hints: deque[tuple[int, int, str, str]] = deque(maxlen=16)  # (lineno, rule, rank, raw)

    def hint(self, j: int, lineno: int, rank: str, raw: str,
             frames_by_rank: Mapping[str, tuple[int, list[str]]]) -> Found | None:
        """Rule ``j``'s hint on a line: remember it, and judge the newest frames before it (its rank's first)."""
        self._hints.append((lineno, j, rank, raw))
        near = [(r, f) for r, f in frames_by_rank.items() if f[1] and lineno - f[0] <= HINT_AFTER]
        if not near:
            return None
        _, (_, frames) = min(near, key=lambda rf: (rf[0] != rank, -rf[1][0]))
        rule = self._rules[j]
        return (rule.rule.id, raw, lineno) if judge(frames, rule.require, rule.exclude) else None

    def frame(self, frames: list[str], rank: str, lineno: int) -> Found | None:
        """A traceback grew a frame: judge it by the hints seen shortly before (its rank's first)."""
        if not self._hints:
            return None
        for hint_line, j, _, raw in sorted(self._hints, key=lambda h: (h[2] != rank, -h[0])):
            if lineno - hint_line > HINT_BEFORE + 3 * len(frames):
                continue
            rule = self._rules[j]
            if judge(frames, rule.require, rule.exclude):
                return rule.rule.id, raw, hint_line
        return None
