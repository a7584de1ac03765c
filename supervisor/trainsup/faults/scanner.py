"""Streaming fault classification of one attempt's output, and of how it ended.

``FaultScanner.feed`` sees every output line of an attempt (stdout and stderr
interleaved, split on ``\\n`` and ``\\r``) and reports new evidence at once, so the
supervisor can journal it or act on live faults while the child still runs.

Evidence explains a failure; it never invents one.  The verdict is the line that
ended the run, in this order of preference:
1. the exception line of a traceback (frames in sight: *anchored*), the first one,
   so launcher noise after the trainer's traceback and a chained exception never
   override the root cause; an exception a launcher raises to report its child
   (accelerate's ``CalledProcessError``, torchrun's ``ChildFailedError``) is not one;
2. a traceback judged by its frames (``frames``: a cut traceback, or one whose
   exception line names no fault), the first one;
3. a live fault (NaN loss: the trainer does not stop by itself);
4. of all other evidence, the *last* line: an argparse error or the launcher's
   report of a SIGKILL just before the end explains it better than a warning
   printed at import.
Evidence followed by a trained step (the ``steps`` bar moved past where it was) did
not end the run and is dropped, whatever it mentions; live evidence stays (``verdict.Held``
keeps the candidates; the first bar after a traceback may be tqdm's closing redraw, so
only a bar past it counts).  Any other tqdm bar that went on past evidence (rose twice, or
to its end) drops it too, except a traceback's and a NaN loss (see ``verdict``).  A message rich or a terminal wrapped is read across its
rows: a later row may name a more specific fault than the first one did.  ``classify_exit``
combines the verdict with the exit status: a run that exits 0 with kohya's success
marker has finished, whatever it printed on the way.

Cost: nearly every line is a progress bar or an info log, and those must cost a
few microseconds at most.  Only lines holding one of the literal keys derived from
the patterns (see ``keys``) reach the patterns, and only the patterns whose
keys they hold.
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterable, Sequence

from .exits import SIGNAL_LINE, STATUS_LINE, TORCHRUN_LINE, ExitInfo, classify_exit, parse_child_status
from .frames import FrameJudge, cut_rules, is_launcher
from .frames import framed as _framed
from .keys import KeyIndex
from .keys import is_cut as _cut
from .linetext import bar_tail, clean_line, rank_tag, starts_record, strip_ansi
from .rules import BUILTIN_RULES, IGNORED_LINE_PATTERNS, FaultRule
from .userrules import compose_rules, load_user_rules
from .verdict import Evidence, Held

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
_IGNORED = tuple(re.compile(p) for p in IGNORED_LINE_PATTERNS)
_TB, _FR, _ST = -1, -2, -3  # owners of the structural patterns in the key index
_HINT = -4  # frame rule j's hint is owned by _HINT - j
_MAX_ROWS = 4  # rows of one wrapped message worth rejoining
_MAX_ROW = 512  # longer lines are not rows rich wrapped at 80 columns: never rejoined
# Fault messages sit at the start of a line (or right after a glued bar) and are
# short; matching only the head and tail of a 64 KiB line bounds the cost of a
# pathological one.  The newline between them stops any pattern spanning the cut.
_HEAD, _TAIL = 4096, 1024
_KNOWN_LINES = 4096  # distinct short lines whose cleaning is remembered


class FaultScanner:
    """Classifies one attempt's output line by line; use one scanner per attempt."""

    def __init__(self, rules: Sequence[FaultRule] = BUILTIN_RULES) -> None:
        self._rules = tuple(rules)
        self._frame_rules = cut_rules(self._rules)
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
        for owner, structural in ((_TB, _TRACEBACK), (_FR, _FRAME), (_ST, STATUS_LINE), (_ST, SIGNAL_LINE), (_ST, TORCHRUN_LINE)):
            self._owner.append(owner)
            patterns.append(structural)
        for j, frame_rule in enumerate(self._frame_rules):
            if frame_rule.hint is not None:
                self._owner.append(_HINT - j)
                patterns.append(frame_rule.hint)
        self._patterns = patterns
        self._index = KeyIndex(patterns)
        # The last rows a wrapped message may span, (text, raw, lineno), and the last
        # line number that held a key.
        self._rows: deque[tuple[str, str, int]] = deque(maxlen=_MAX_ROWS)
        self._key_row = -1
        self._frames: dict[str, tuple[int, list[str]]] = {}
        self._judge = FrameJudge(self._frame_rules)
        self._seen: dict[str, Evidence] = {}
        priority: dict[str, int] = {}  # a fault's first place in the table
        for n, rule in enumerate(self._rules):
            priority.setdefault(rule.id, n)
        # The candidates for the verdict, one per kind (see the module doc).
        self._held = Held(frozenset(r.id for r in self._rules if r.live), priority)
        self._child: tuple[int | None, int | None] | None = None
        self._known: dict[str, tuple[str, bool, bool]] = {}  # see _prepare

    @property
    def verdict(self) -> Evidence | None:
        """What ended the run, so far (see the module doc for the order of preference)."""
        if self._judge.pending is not None:
            self._record(_framed(self._judge.pending[0]))  # the traceback ended at that frame
            self._judge.pending = None
        return self._held.verdict

    def note_bar(self, line: str) -> None:
        """Tell the scanner of a training bar it was not fed (a plain redraw): evidence seen
        before the bar moves on did not end the run."""
        self._held.note_bar(line)

    @property
    def last_frame_line(self) -> int:
        """The line number of the newest traceback frame seen (0: none)."""
        return max((f[0] for f in self._frames.values()), default=0)

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
        if self._judge.pending is None:
            return self._feed(raw_line, lineno)
        settled = self._settle(raw_line, lineno)
        return self._feed(raw_line, lineno) or settled

    def _settle(self, raw: str, lineno: int) -> Evidence | None:
        """Record what a hint in quoted code judged once its traceback shows no deeper frame: at the
        next line of its rank that is not a frame, a caret row or more code (any line, once stale)."""
        assert self._judge.pending is not None
        found, rank = self._judge.pending
        text = clean_line(raw)
        if lineno - found[2] <= _FRAME_STALE_LINES and (
                rank_tag(raw) != rank or not text.strip("^~ ") or _FRAME.match(text) is not None
                or self._is_source_line(raw, text, lineno)):
            return None
        self._judge.pending = None
        return self._record(_framed(found))

    def _feed(self, raw_line: str, lineno: int) -> Evidence | None:
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
            # (a key can straddle two rows only where a word was cut: rich folded it, or a
            # terminal hard-wrapped it; checked inline first)
            if rows and (self._key_row >= rows[0][2]
                         or (_cut(rows[-1]) and index.boundary_hit(rows[-1][0], text))):
                found = self._scan_joined(text, raw_line, lineno)
                if found is not None:
                    rows.clear()
                    return self._record(found)
            if len(text) <= _MAX_ROW:
                rows.append((text, raw_line, lineno))
            else:
                rows.clear()
            return None
        tail = None
        if "%|" in text:
            if "steps:" in text:
                self._held.bar = text
            self._held.draw(text)
            tail = bar_tail(text)
        ev, structural = self._scan(text, raw_line, lineno) if hit else (None, False)
        if rows and ev is None and not structural and tail is None and len(text) <= _MAX_ROW:
            ev = self._scan_joined(text, raw_line, lineno)
        # Remember what the next line may continue: nothing after a traceback line, only
        # the glued text after a bar, else this line; after evidence of its own, only this
        # line (the rows rich wraps its message onto may name the fault more exactly).
        if ev is not None and ev.lineno == lineno and not (structural or ev.framed or tail is not None
                                                           or len(text) > _MAX_ROW):
            rows.clear()
            rows.append((text, raw_line, lineno))
        elif ev is not None or structural or tail is not None or len(text) > _MAX_ROW:
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
                frames.append(m.group(1).replace("\\", "/").rsplit("/", 1)[-1] + " " + m.group(2).strip())
                self._frames[rank] = (lineno, frames)
                framed = self._judge.frame(frames, rank, lineno, raw)
                return _framed(framed), True
            elif owner == _ST and (status := parse_child_status(text)) is not None:
                self._child = status
        # A frame rule's hint counts in the code the innermost frame quotes too (``te_outputs[prompt]``).
        source = self._is_source_line(raw, text, lineno)
        hinted = None
        if candidates and self._owner[candidates[-1]] <= _HINT:
            hinted = self._note_hints(text, raw, lineno, candidates, source)
        if source:
            return hinted, True  # a traceback quoting code; its exception line follows
        # A launcher's report of its child quotes the child's argv: only its weak wording (the child's
        # fate, a SIGKILL) is evidence there.
        found = self._match(text, raw, lineno, candidates, weak_only=self._launcher_reports(raw, lineno))
        if found is None:
            return hinted, structural
        return Evidence(found[0].id, raw, lineno, found[0].strength, self._in_traceback(raw, lineno),
                        explanation=found[0].explanation), structural

    def _launcher_reports(self, raw: str, lineno: int) -> bool:
        """Whether ``raw`` ends a launcher's traceback (accelerate's or torchrun's report of its child)."""
        frames = self._frames_in_sight(raw, lineno)
        return frames is not None and is_launcher(frames)

    def _note_hints(self, text: str, raw: str, lineno: int, candidates: list[int], code: bool) -> Evidence | None:
        """Remember the frame rules' hints on this line; judge the frames in sight by them."""
        rank = rank_tag(raw)
        for k in candidates:
            j = _HINT - self._owner[k]
            if j >= 0 and self._patterns[k].search(text) is not None:
                framed = self._judge.hint(j, lineno, rank, raw, self._frames, code)
                if framed is not None:
                    return _framed(framed)
        return None

    def _in_traceback(self, raw: str, lineno: int) -> bool:
        """Whether a line at ``lineno`` may be the exception line of a traceback in sight
        (one cut off after its header counts: it shows what ended the run)."""
        last = self._frames.get(rank_tag(raw))
        return last is not None and lineno - last[0] <= _FRAME_STALE_LINES and not is_launcher(last[1])

    def _frames_in_sight(self, raw: str, lineno: int) -> list[str] | None:
        """The frames of the traceback a line at ``lineno`` may end, if one is in sight."""
        last = self._frames.get(rank_tag(raw))
        if last is None or not last[1] or lineno - last[0] > _FRAME_STALE_LINES:
            return None
        return last[1]

    def _is_source_line(self, raw: str, text: str, lineno: int) -> bool:
        """Whether ``text`` is the code line Python prints under a traceback frame.

        ``raise RuntimeError(f"NaN detected in latents: ...")`` quotes the wording,
        but the evidence is the exception line; code lines are indented by four
        spaces (after any prefix) and follow a frame, exception lines are not.
        """
        if self._frames_in_sight(raw, lineno) is None:
            return False
        plain = strip_ansi(raw)
        at = plain.find(text)
        # Indented by four spaces after any decoration (and the blank a tag may add); a log
        # record's level column ("ERROR    ") and rich's continuation rows (29 blanks) are not.
        head = plain[:at]
        decoration = head.rstrip()
        return 4 <= len(head) - len(decoration) <= 8 and not decoration[-1:].isalpha()

    def _scan_joined(self, text: str, raw: str, lineno: int) -> Evidence | None:
        """Try the remembered rows joined to ``text``, without and with a space.

        Earlier rows are joined as rich wrapped them: without a space after a piece
        of a folded word, else with one.
        """
        rows = list(self._rows)
        starts = [0]
        acc = rows[0][0]
        for before, row in itertools.pairwise(rows):
            acc += ("" if _cut(before) else " ") + row[0]
            starts.append(len(acc) - len(row[0]))
        for sep in ("", " "):
            joined = acc + sep + text
            found = self._match(joined, raw, lineno, self._index.candidates(joined), len(acc), starts,
                                self._launcher_reports(rows[0][1], rows[0][2]))
            if found is not None:
                first = max(i for i, s in enumerate(starts) if s <= found[1])
                line = "\n".join([r[1] for r in rows[first:]] + [raw])
                start = rows[first][2]
                return Evidence(found[0].id, line, start, found[0].strength,
                                self._in_traceback(rows[first][1], start), explanation=found[0].explanation)
        return None

    def _match(self, text: str, raw: str, lineno: int, candidates: list[int], boundary: int | None = None,
               starts: Sequence[int] = (0,), weak_only: bool = False) -> tuple[FaultRule, int] | None:
        """The first rule in table order with a candidate pattern that matches unrefuted,
        with where the match starts.  For joined rows (``starts``: where each row
        begins) the match must span the last join, and only the rows it spans are
        checked for warnings and excludes."""
        refuted = -1
        for k in candidates:  # ascending: table order
            i = self._owner[k]
            if i < 0 or i == refuted or (weak_only and self._rules[i].strength != "weak"):
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
        frames = self._frames_in_sight(raw, lineno)
        if frames is None:
            return not self._rules[i].frames_needed  # no traceback in sight: the message alone decides
        for frame in reversed(frames):  # innermost first
            if any(x.search(frame) for x in exclude):
                return False
            if any(x.search(frame) for x in require):
                return True
        return not require  # frames in sight, none of the kind the rule requires

    def _record(self, ev: Evidence | None) -> Evidence | None:
        if ev is None:
            return None
        ev = self._held.record(ev)
        if ev.fault in self._seen:
            return None
        self._seen[ev.fault] = ev
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
