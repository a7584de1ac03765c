"""Streaming fault classification of one attempt's output, and of how it ended.

``FaultScanner.feed`` sees every output line of an attempt (stdout and stderr
interleaved, split on ``\\n`` and ``\\r``) and reports new evidence at once, so the
supervisor can journal it or act on live faults while the child still runs.  The
verdict is the first root-strength evidence: launcher noise that follows the real
traceback (accelerate's ``CalledProcessError``, torchrun's ``ChildFailedError``)
never overrides it.  ``classify_exit`` combines the verdict with the exit status.

Cost: nearly every line is a progress bar or an info log, and those must cost a
few microseconds at most.  Only lines holding one of the literal keys derived from
the patterns (see ``fault_keys``) reach the patterns, and only the patterns whose
keys they hold.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .fault_keys import KeyIndex
from .fault_keys import is_folded as _folded
from .fault_rules import BUILTIN_RULES, IGNORED_LINE_PATTERNS, FaultRule, compose_rules, load_user_rules
from .linetext import bar_tail, clean_line, rank_tag, starts_record, strip_ansi

__all__ = [
    "Evidence",
    "ExitInfo",
    "FaultScanner",
    "KeyIndex",
    "classify_exit",
    "classify_text",
    "compose_rules",
    "load_user_rules",
    "parse_child_status",
]

_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
_FRAME = re.compile(r'^File "([^"]*)", line \d+, in (.+)$')
# Frames older than this many lines no longer describe the current message; the
# slack lets two or three interleaved ranks print between frame and message.
_FRAME_STALE_LINES = 12
_STATUS = re.compile(r"returned non-zero exit status (-?\d+)")
_SIGNAL = re.compile(r"died with <Signals\.SIG\w+: (\d+)>")
_TORCHRUN = re.compile(r"^exitcode  +: (-?\d+)|\(exitcode: (-?\d+)\)")
_IGNORED = tuple(re.compile(p) for p in IGNORED_LINE_PATTERNS)
_TB, _FR, _ST = -1, -2, -3  # owners of the structural patterns in the key index
_MAX_ROWS = 4  # rows of one wrapped message worth rejoining
_MAX_ROW = 512  # longer lines are not rows rich wrapped at 80 columns: never rejoined
# Fault messages sit at the start of a line (or right after a glued bar) and are
# short; matching only the head and tail of a 64 KiB line bounds the cost of a
# pathological one.  The newline between them stops any pattern spanning the cut.
_HEAD, _TAIL = 4096, 1024
_KNOWN_LINES = 4096  # distinct short lines whose cleaning is remembered


@dataclass(frozen=True)
class Evidence:
    """A line that is evidence for a fault: ``line`` as the child wrote it (the rows
    joined by ``\\n`` when a wrapped message matched across them), ``lineno`` its first."""

    fault: str
    line: str
    lineno: int
    strength: str


@dataclass(frozen=True)
class ExitInfo:
    """How an attempt ended, including the real child's status behind accelerate."""

    exit_code: int | None
    signal: int | None
    child_status: int | None
    child_signal: int | None
    success_marker_seen: bool


class FaultScanner:
    """Classifies one attempt's output line by line; use one scanner per attempt."""

    def __init__(self, rules: Sequence[FaultRule] = BUILTIN_RULES) -> None:
        self._rules = tuple(rules)
        self._excludes = [tuple(re.compile(p) for p in r.excludes) for r in self._rules]
        self._frames_require = [tuple(re.compile(p) for p in r.frames_require) for r in self._rules]
        self._frames_exclude = [tuple(re.compile(p) for p in r.frames_exclude) for r in self._rules]
        # One flat, ordered pattern list: the rules' patterns in table order (so the
        # lowest matching index is the winning rule), then the structural ones.
        self._owner: list[int] = []
        patterns: list[re.Pattern[str]] = []
        for i, rule in enumerate(self._rules):
            for p in rule.patterns:
                self._owner.append(i)
                patterns.append(re.compile(p))
        for owner, structural in ((_TB, _TRACEBACK), (_FR, _FRAME), (_ST, _STATUS), (_ST, _SIGNAL), (_ST, _TORCHRUN)):
            self._owner.append(owner)
            patterns.append(structural)
        self._patterns = patterns
        self._index = KeyIndex(patterns)
        # The last rows a wrapped message may span, (text, raw, lineno), and the last
        # line number that held a key.
        self._rows: deque[tuple[str, str, int]] = deque(maxlen=_MAX_ROWS)
        self._key_row = -1
        self._frames: dict[str, tuple[int, list[str]]] = {}
        self._seen: dict[str, Evidence] = {}
        self._root: Evidence | None = None
        self._weak: Evidence | None = None
        self._child: tuple[int | None, int | None] | None = None
        self._known: dict[str, tuple[str, bool, bool]] = {}  # see _prepare

    @property
    def verdict(self) -> Evidence | None:
        """The root cause so far: the first root evidence, else the first weak one."""
        return self._root if self._root is not None else self._weak

    @property
    def evidence(self) -> tuple[Evidence, ...]:
        """The first evidence of each fault seen, in the order seen."""
        return tuple(self._seen.values())

    @property
    def child_status(self) -> tuple[int | None, int | None] | None:
        """The last ``(status, signal)`` the launcher reported for its child, if any."""
        return self._child

    def feed(self, raw_line: str, lineno: int) -> Evidence | None:
        """Scan one output line; return Evidence when it is the first for its fault."""
        known = self._known.get(raw_line)
        if known is None:
            known = self._prepare(raw_line)
        text, hit, record = known
        rows = self._rows
        if not text or record:
            rows.clear()  # nothing before this line can be part of its message
            if not text:
                return None
        index = self._index
        if not hit and "%|" not in text:
            # The common case, an ordinary line holding no key: it can only complete
            # a message that rich wrapped, begun by the rows before it.
            # (a key can straddle two rows only where rich folded a word: checked inline first)
            if rows and (self._key_row >= rows[0][2]
                         or (_folded(rows[-1][0]) and index.boundary_hit(rows[-1][0], text))):
                found = self._scan_joined(text, raw_line, lineno)
                if found is not None:
                    rows.clear()
                    return self._record(found)
            if len(text) <= _MAX_ROW:
                rows.append((text, raw_line, lineno))
            else:
                rows.clear()
            return None
        tail = bar_tail(text) if "%|" in text else None
        ev, structural = self._scan(text, raw_line, lineno) if hit else (None, False)
        if rows and ev is None and not structural and tail is None and len(text) <= _MAX_ROW:
            ev = self._scan_joined(text, raw_line, lineno)
        # Remember what the next line may continue: nothing after evidence or a
        # traceback line, only the glued text after a bar, else this line too.
        if ev is not None or structural or tail is not None or len(text) > _MAX_ROW:
            rows.clear()
            if tail and len(tail) <= _MAX_ROW:
                rows.append((tail, raw_line, lineno))
                hit = index.hit(tail)
        else:
            rows.append((text, raw_line, lineno))
        if hit:
            self._key_row = lineno
        return self._record(ev)

    def _prepare(self, raw: str) -> tuple[str, bool, bool]:
        """The line's bare text, whether it holds a key, whether it starts a record.

        All three depend on the line alone, and rich logs repeat many lines exactly
        (continuation rows, records in the same second print no time), so short
        lines are remembered: a repeat then costs one dict lookup.
        """
        text = clean_line(raw)
        if len(text) > _HEAD + _TAIL:
            text = text[:_HEAD] + "\n" + text[-_TAIL:]
        known = (text, bool(text) and self._index.hit(text), starts_record(raw))
        if len(raw) <= _MAX_ROW:
            if len(self._known) >= _KNOWN_LINES:
                self._known.clear()  # a crude bound; the lines worth keeping come back quickly
            self._known[raw] = known
        return known

    def _scan(self, text: str, raw: str, lineno: int) -> tuple[Evidence | None, bool]:
        """Slow path for a line holding a key: traceback structure, status, then rules."""
        candidates = self._index.candidates(text)
        structural = False
        for k in candidates:
            owner = self._owner[k]
            if owner == _TB and _TRACEBACK.search(text):
                self._frames[rank_tag(raw)] = (lineno, [])
                structural = True
            elif owner == _FR and (m := _FRAME.match(text)) is not None:
                rank = rank_tag(raw)
                frames = self._frames.get(rank, (lineno, []))[1]
                frames.append(m.group(1).replace("\\", "/").rsplit("/", 1)[-1] + " " + m.group(2))
                self._frames[rank] = (lineno, frames)
                return None, True
            elif owner == _ST and (status := parse_child_status(text)) is not None:
                self._child = status
        if self._is_source_line(raw, text, lineno):
            return None, True  # a traceback quoting code; its exception line follows
        found = self._match(text, raw, lineno, candidates)
        return (None if found is None else Evidence(found[0].id, raw, lineno, found[0].strength)), structural

    def _is_source_line(self, raw: str, text: str, lineno: int) -> bool:
        """Whether ``text`` is the code line Python prints under a traceback frame.

        ``raise RuntimeError(f"NaN detected in latents: ...")`` quotes the wording,
        but the evidence is the exception line; code lines are indented by four
        spaces (after any prefix) and follow a frame, exception lines are not.
        """
        last = self._frames.get(rank_tag(raw))
        if last is None or not last[1] or lineno - last[0] > _FRAME_STALE_LINES:
            return False
        plain = strip_ansi(raw)
        at = plain.find(text)
        return at >= 4 and plain[at - 4:at] == "    "

    def _scan_joined(self, text: str, raw: str, lineno: int) -> Evidence | None:
        """Try the remembered rows joined to ``text``, without and with a space.

        Earlier rows are joined as rich wrapped them: without a space after a piece
        of a folded word, else with one.
        """
        rows = list(self._rows)
        starts = [0]
        acc = rows[0][0]
        for before, row in itertools.pairwise(rows):
            acc += ("" if _folded(before[0]) else " ") + row[0]
            starts.append(len(acc) - len(row[0]))
        for sep in ("", " "):
            joined = acc + sep + text
            found = self._match(joined, raw, lineno, self._index.candidates(joined), len(acc), starts)
            if found is not None:
                first = max(i for i, s in enumerate(starts) if s <= found[1])
                line = "\n".join([r[1] for r in rows[first:]] + [raw])
                return Evidence(found[0].id, line, rows[first][2], found[0].strength)
        return None

    def _match(self, text: str, raw: str, lineno: int, candidates: list[int],
               boundary: int | None = None, starts: Sequence[int] = (0,)) -> tuple[FaultRule, int] | None:
        """The first rule in table order with a candidate pattern that matches unrefuted,
        with where the match starts.  For joined rows (``starts``: where each row
        begins) the match must span the last join, and only the rows it spans are
        checked for warnings and excludes."""
        refuted = -1
        for k in candidates:  # ascending: table order
            i = self._owner[k]
            if i < 0 or i == refuted:
                continue
            m = self._patterns[k].search(text)
            if m is None or (boundary is not None and not m.start() < boundary < m.end()):
                continue
            own = text[max(s for s in starts if s <= m.start()):]
            if any(x.search(own) for x in _IGNORED):
                return None  # a warning is never evidence, whatever it mentions
            if any(x.search(own) for x in self._excludes[i]) or not self._frames_allow(i, raw, lineno):
                refuted = i  # this rule is refuted for the line; later rules may still match
                continue
            return self._rules[i], m.start()
        return None

    def _frames_allow(self, i: int, raw: str, lineno: int) -> bool:
        """Judge a frame-checked rule by the frames of the traceback the message ends."""
        require, exclude = self._frames_require[i], self._frames_exclude[i]
        if not require and not exclude:
            return True
        last, frames = self._frames.get(rank_tag(raw), (0, []))
        if not frames or lineno - last > _FRAME_STALE_LINES:
            return True  # no traceback in sight: the message alone decides
        for frame in reversed(frames):  # innermost first
            if any(x.search(frame) for x in exclude):
                return False
            if any(x.search(frame) for x in require):
                return True
        return not require  # frames in sight, none of the kind the rule requires

    def _record(self, ev: Evidence | None) -> Evidence | None:
        if ev is None or ev.fault in self._seen:
            return None
        self._seen[ev.fault] = ev
        if ev.strength == "root":
            if self._root is None:
                self._root = ev
        elif self._weak is None:
            self._weak = ev
        return ev


def classify_text(lines: Iterable[str], rules: Sequence[FaultRule] = BUILTIN_RULES) -> Evidence | None:
    """The verdict for a finished log; an item may hold several ``\\n``/``\\r`` separated lines."""
    scanner = FaultScanner(rules)
    lineno = 0
    for chunk in lines:
        for line in re.split(r"\r\n|\r|\n", chunk.rstrip("\r\n")):
            lineno += 1
            scanner.feed(line, lineno)
    return scanner.verdict


def classify_exit(info: ExitInfo, verdict: Evidence | None) -> str | None:
    """The fault id of a finished attempt, or None for a clean finish.

    Evidence from the output wins; then a SIGKILL of the process or of the real child
    behind accelerate (which exits 1 and only prints the child's fate) means the host
    OOM killer; any other failure is ``unknown``.  Exit 0 is clean only with the
    success marker (``model saved.``): sd-scripts exits 0 after "No data found".
    """
    if verdict is not None:
        return verdict.fault
    if info.signal == 9 or info.exit_code in (137, -9) or info.child_signal == 9 or info.child_status in (137, -9):
        return "host_oom_killed"
    if info.signal is not None or info.exit_code != 0:
        return "unknown"
    if info.child_signal is not None or info.child_status not in (None, 0):
        return "unknown"
    return None if info.success_marker_seen else "unknown"


def parse_child_status(clean_line: str) -> tuple[int | None, int | None] | None:
    """``(status, signal)`` of the child as accelerate or torchrun report it, else None."""
    m = _STATUS.search(clean_line)
    if m is not None:
        return int(m.group(1)), None
    m = _SIGNAL.search(clean_line)
    if m is not None:
        return None, int(m.group(1))
    m = _TORCHRUN.search(clean_line)
    if m is not None:
        code = int(m.group(1) or m.group(2))
        return (None, -code) if code < 0 else (code, None)
    return None
