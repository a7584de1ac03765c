"""Turning one raw output line of a training child into text that rules can match.

A trainer's output reaches the supervisor decorated: ANSI colours from rich, rank
tags from torchrun (``[rank0]:``), timestamps and level columns from rich, GUIs and
log shippers (``[12:01:02] [STDERR]``, ``2024-08-01T12:00:00Z stdout F``,
``INFO |``, ``2024-05-01 10:00:00,123 - INFO -``, ``[INFO]``, kohya_ss's
``12:01:02-123456 INFO``, Ray's ``(RayTrainWorker pid=61407, ip=10.0.3.14)``), rich's right-aligned
``train_util.py:123`` source column, and tqdm bars that the next message gets glued onto.  Logs pasted
into an issue also carry markdown: ``> `` quote markers (nested too) and code fence lines, which say
nothing and clean to an empty line.  rich's boxed tracebacks are read in CPython's words
(the box's header and ``path:123 in func`` rows become the header and frames).  Fault patterns are
written against the bare message, so everything here peels the decoration off and nothing else.

Speed matters more than elegance: ``clean_line`` runs on every line of logs that
reach several GB, so every regex is compiled once and the common case (a line with
no decoration) is rejected after looking at its first and last few characters.
"""

from __future__ import annotations

import re

__all__ = ["bar_tail", "clean_line", "rank_tag", "starts_record", "strip_ansi"]

# CSI sequences (colours, cursor moves), OSC sequences (rich writes hyperlinks as
# OSC 8, ended by BEL or ST) and the remaining two-byte escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")

# One leading decoration; the whole prefix is any run of them.  Each alternative
# must consume at least one character so the repetition below cannot spin.
_ONE_PREFIX = r"""
    \[(?:                                                       # bracketed: rank tags, times, stream tags
        (?:rank|default)\d+\]:?
      | \d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\]                       # [12:01:02]
      | \d{4}[-/]\d{2}[-/]\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]:?
      | \d{2}/\d{2}/\d{2,4}[ ]\d{2}:\d{2}:\d{2}\]               # rich's default [%x %X]
      | (?:STDERR|STDOUT|stderr|stdout)\]:?
      | (?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|debug|info|warning|warn|error)\]:?   # [INFO] (fluxgym, GUIs)
    )
  | \d{4}[-/]\d{2}[-/]\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?:?   # bare ISO-ish dates
        # "- name - " (logging's default)
        (?:[ ]-[ ](?:[\w.]{1,64}[ ]-[ ](?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b))?)?
  | \d{1,2}:\d{2}:\d{2}(?:[.,-]\d{1,6})?(?=\s)                  # bare times (kohya_ss GUI: 12:01:02-123456)
  | \d{1,6}:[ ](?=\S)                                          # a GUI's or pastebin's line numbers ("251: ")
  | (?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)            # level words, but only in the
        (?:[ \t]*[|-](?=\s)|:|[ \t]{2,}|(?<=CRITICAL)[ ]|(?<=WARNING)[ ])  # shapes loggers print them in
  | std(?:out|err)[ ][FP](?=\s)                                 # CRI (containerd/k8s) stream + tag
  | \|(?=\s)                                                    # "| " column separators
  | >+(?=\s|$)                                                  # markdown quote markers, nested too
  | \(\w{1,64}[ ]pid=\d+(?:,[ ]ip=[\d.:]+)?\)                     # Ray's actor prefix
"""
_PREFIX = re.compile(r"(?:\s*(?:" + _ONE_PREFIX + r"))+\s*", re.VERBOSE)

_FENCES = frozenset({"```", "~~~"})  # markdown code fences
_FENCE_LAST = frozenset("`~")

# rich's boxed tracebacks (``rich.traceback``): rows inside ``│ ... │`` between ``╭─ Traceback ... ─╮``
# and ``╰─...─╯``; a frame row is ``path:123 in func``, a code row ``❱ 123 │ code``.
_BOX_FIRST = frozenset("│╭╰")
_RICH_FRAME = re.compile(r"(?P<path>\S.{0,400}?):(?P<line>\d+) in (?P<func>\S+)$")
_RICH_CODE = re.compile(r"(?:❱\s*)?\d+(?:\s*│|$)")
_MARKUP_FIRST = _BOX_FIRST | _FENCE_LAST

# What follows the last run of 2+ spaces when rich added its source column.
_SOURCE_COLUMN = re.compile(r"[\w.-]+\.py:\d+")

# First characters a decorated line can start with; anything else skips the regex.
_PREFIX_FIRST = frozenset("[0123456789 \t|DIWECF>(")

# rich's log layout (datefmt "%Y-%m-%d %H:%M:%S", as trainers that log through rich set it):
# a 19-character time or 19 blanks (rich blanks a repeated time), a space, then the level
# padded to 8 and a space.  It starts nearly every log record, so it gets a path without regexes.
_RICH_LEVELS = frozenset({"DEBUG    ", "INFO     ", "WARNING  ", "ERROR    ", "CRITICAL "})

# The end of a tqdm bar: "| 12/100 [00:01<00:09, 1.2it/s, loss=0.1]".  The total
# may be "?" and counts may carry k/M/G suffixes.
_BAR_END = re.compile(r"\|\s*[\d.]+[kMG]?(?:/[\d.?]+[kMG]?)?(?:it)?\s*\[[^\]\n]*\]")

# The tag may follow other decoration (a quote marker, a GUI's time): a tag in the first characters.
_RANK = re.compile(r".{0,64}?\[(?:rank|default)(\d+)\]")
_RANK_WITHIN = 96


def strip_ansi(s: str) -> str:
    """Remove ANSI escape sequences (colours, cursor moves, OSC hyperlinks)."""
    if "\x1b" not in s:
        return s
    return _ANSI.sub("", s)


def clean_line(s: str) -> str:
    """Return the bare message of one output line, stripped of decoration.

    Removes ANSI codes, any run of leading rank tags, timestamps, stream tags,
    level columns and ``|`` separators, and rich's trailing ``file.py:123`` column.
    """
    if "\x1b" in s:
        s = _ANSI.sub("", s)
    if s[20:29] in _RICH_LEVELS and (
        s[:20].isspace() or (s[4:5] == "-" and s[13:14] == ":" and s[19:20] == " ")
    ):
        s = s[29:]
    if s[:1].isspace():
        # Blank-led rows (rich's continuation rows start with 29 blanks) would make the
        # prefix regex below retry every alternative at each blank; its own leading
        # ``\s*`` and the final strip() drop the same characters.
        s = s.lstrip()
    if s[:1] in _PREFIX_FIRST or s.startswith("std"):
        m = _PREFIX.match(s)
        if m is not None:
            s = s[m.end():]
    s = s.rstrip()
    first = s[:1]
    if first in _MARKUP_FIRST:  # rare: a row of rich's boxed traceback, a markdown fence
        if first in _BOX_FIRST:
            return _unbox(s)
        if s[:3] in _FENCES:
            s = _unfence(s)
    last = s[-1:]
    if last.isdigit():
        s = _drop_source_column(s)
    elif last in _FENCE_LAST and s[-3:] in _FENCES:
        s = _unfence(s)
    return s.strip()


def _unbox(s: str) -> str:
    """A row of rich's boxed traceback, in CPython's words: the top border is the traceback's header,
    a ``path:123 in func`` row its frame; code rows, other borders and nested panels say nothing."""
    if s[0] != "│":
        return "Traceback (most recent call last):" if "Traceback" in s else ""
    inner = s.strip("│ \t")
    if not inner or inner[0] in _BOX_FIRST or _RICH_CODE.match(inner) is not None:
        return ""
    m = _RICH_FRAME.match(inner)
    if m is None:
        return inner
    return f'File "{m.group("path")}", line {m.group("line")}, in {m.group("func")}'


def _unfence(s: str) -> str:
    """A markdown code fence line says nothing (``````` or ```````python``); text glued to a fence is kept."""
    if s[:3] in _FENCES:
        rest = s.lstrip(s[0]).strip()
        if not rest or (len(rest) <= 20 and rest[0].islower() and " " not in rest):
            return ""  # a fence, with or without its language tag
        return clean_line(rest)
    return s.rstrip(s[-1]).rstrip()


def _drop_source_column(s: str) -> str:
    """Remove rich's right-aligned ``file.py:123`` from the end of ``s``.

    Only when at least two spaces of padding precede it, so that a sentence ending
    in "see train.py:12" keeps its reference.  Splitting at the last double space is
    several times cheaper than a regex search anchored at the end.
    """
    head, sep, tail = s.rpartition("  ")
    if not sep or _SOURCE_COLUMN.fullmatch(tail) is None:
        return s
    return head


def bar_tail(text: str) -> str | None:
    """For a cleaned tqdm progress-bar line, the text glued on after the bar.

    Returns None when ``text`` is not a bar, ``""`` for a bare bar, and the glued
    remainder (for example ``Traceback (most recent call last):``) otherwise.  A bar
    fragment whose end was overwritten counts as a bar with nothing after it: its
    tail cannot be told apart from the bar, and the fault patterns are searched
    anywhere in the line anyway.
    """
    pos = text.find("%|")
    if pos < 0:
        return None
    if text.endswith("]"):
        return ""  # the common case, a bare bar; a glued tail rarely ends in "]"
    m = _BAR_END.search(text, pos + 2)
    if m is None:
        return ""
    return text[m.end():].strip()


def rank_tag(raw: str) -> str:
    """The rank number of a ``[rankN]:`` / ``[defaultN]:`` tagged line, else ``""``.

    Used to keep the traceback state of interleaved ranks apart.
    """
    if "[rank" not in raw and "[default" not in raw:
        return ""
    m = _RANK.match(strip_ansi(raw)[:_RANK_WITHIN])
    return m.group(1) if m is not None else ""


def starts_record(raw: str) -> bool:
    """Whether ``raw`` opens a new rich log record (its level column is filled).

    A record's continuation rows leave the time and level columns blank, so a row
    with a level cannot continue the message of the rows before it.  Cheap by
    design: it looks at that rich layout only and says False for anything
    else (other layouts, or ANSI-coloured rows), which only means "may continue".
    """
    return raw[20:29] in _RICH_LEVELS
