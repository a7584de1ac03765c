"""Streaming fault classification of one attempt's output, and of how it ended.

``FaultScanner.feed`` sees every output line of an attempt (stdout and stderr
interleaved, split on ``\\n`` and ``\\r``) and reports new evidence at once, so the
supervisor can journal it or act on live faults while the child still runs.

Evidence explains a failure; it never invents one, and a failure is never read as health.  Each
line goes through the rule table (its evidence), the structural reads of ``tracebacks`` (headers,
frames, chained exceptions, launcher reports) and ``ending`` (an exception line or a signal death no
rule names: ``unknown`` with its line; NaN in any shape naming a loss; metric progress).  The verdict
is chosen by ``verdict.Held``: a NaN loss first (the first cause), then the earliest of a first
cause (out of memory) and a traceback's exception line a rule names (never a launcher's report of
its child), then a traceback judged by its frames, then what the log ends with: a wait it ends at,
else the newer of the last other evidence and the ``unknown`` exception it ends with.  Evidence that
training outlived is dropped (see ``verdict``).  A message rich or a terminal wrapped is read across
its rows: a later row may name a more specific fault than the first one did.  ``classify_exit``
combines the verdict with the exit status: a run that exits 0 with its trainer's success marker has
finished, whatever it printed on the way.

The scanner knows no trainer: it is given the trainer's ``ProgressFormat`` (the adapter's output
format; ``diagnose`` gives every known one) and asks it which lines are the trainer's progress.

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
from dataclasses import replace

from .ending import EXCEPTION, LAUNCHER_EXCEPTIONS, SIGNAL_DEATH, LineReads, crash, ending, wanted
from .exits import CRASH_SIGNALS, SIGNAL_LINE, STATUS_LINE, TORCHRUN_LINE, ExitInfo, classify_exit, parse_child_status
from .frames import FrameJudge, cut_rules, judge
from .frames import framed as _framed
from .keys import KeyIndex
from .keys import is_cut as _cut
from .linetext import bar_tail, clean_line, rank_tag, starts_record
from .progress import ProgressFormat, hints_of
from .rules import BUILTIN_RULES, IGNORED_LINE_PATTERNS, FaultRule
from .tracebacks import CHAINED, FRAME, STALE_LINES, TRACEBACK, Tracebacks
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

_IGNORED = tuple(re.compile(p) for p in IGNORED_LINE_PATTERNS)
_TB, _FR, _ST, _END, _CHAIN = -1, -2, -3, -5, -6  # owners of the structural patterns in the key index
_HINT = -100  # frame rule j's hint is owned by _HINT - j
# torchrun's failure table names a rank on its own row, just above the rank's exit code
_TABLE_RANK = re.compile(r"^\s*rank\s+: \d+")
_MAX_ROWS = 4  # rows of one wrapped message worth rejoining
_MAX_ROW = 512  # longer lines are not rows rich wrapped at 80 columns: never rejoined
# Fault messages sit at the start of a line (or right after a glued bar) and are
# short; matching only the head and tail of a 64 KiB line bounds the cost of a
# pathological one.  The newline between them stops any pattern spanning the cut.
_HEAD, _TAIL = 4096, 1024
_KNOWN_LINES = 4096  # distinct short lines whose cleaning is remembered


class FaultScanner:
    """Classifies one attempt's output line by line; use one scanner per attempt."""

    def __init__(self, rules: Sequence[FaultRule] = BUILTIN_RULES, progress: ProgressFormat | None = None) -> None:
        self._rules = tuple(rules)
        self._progress = progress
        self._hints = hints_of(progress)
        self._frame_rules = cut_rules(self._rules)
        self._excludes = [tuple(re.compile(p) for p in r.excludes) for r in self._rules]
        self._lookalikes = [tuple(re.compile(p) for p in r.lookalikes) for r in self._rules]
        self._frames_require = [tuple(re.compile(p) for p in r.frames_require) for r in self._rules]
        self._frames_exclude = [tuple(re.compile(p) for p in r.frames_exclude) for r in self._rules]
        self._frames_forbid = [tuple(re.compile(p) for p in r.frames_forbid) for r in self._rules]
        # One flat, ordered pattern list: the rules' patterns in table order (so the
        # lowest matching index is the winning rule), then the structural ones.
        self._owner: list[int] = []
        patterns: list[re.Pattern[str]] = []
        for i, rule in enumerate(self._rules):
            for p in rule.patterns:
                self._owner.append(i)
                patterns.append(re.compile(p))
        for owner, structural in ((_TB, TRACEBACK), (_FR, FRAME), (_ST, STATUS_LINE), (_ST, SIGNAL_LINE),
                                  (_ST, TORCHRUN_LINE), (_END, EXCEPTION), (_END, SIGNAL_DEATH), (_CHAIN, CHAINED)):
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
        self._tb = Tracebacks()
        self._tail_at: int | None = None  # the line of held ``tail`` evidence
        self._refuted = False  # the last _match refuted a rule (an exclude matched: a known look-alike)
        self._judge = FrameJudge(self._frame_rules)
        self._seen: dict[str, Evidence] = {}
        priority: dict[str, int] = {}  # a fault's first place in the table
        for n, rule in enumerate(self._rules):
            priority.setdefault(rule.id, n)
        # The candidates for the verdict, one per kind (see the module doc).
        self._held = Held(frozenset(r.id for r in self._rules if r.live), priority,
                          progress.progress if progress is not None else None)
        self._reads = LineReads(self._rules, self._held)
        self._child: tuple[int | None, int | None] | None = None
        self._known: dict[str, tuple[str, bool, bool, bool, bool, bool]] = {}  # see _prepare

    @property
    def verdict(self) -> Evidence | None:
        """What ended the run, so far (see the module doc for the order of preference)."""
        if self._judge.pending is not None:
            self._record(_framed(self._judge.pending[0]))  # the traceback ended at that frame
            self._judge.pending = None
        return self._held.verdict

    def note_bar(self, line: str) -> None:
        """Tell the scanner of a line of the trainer's progress it was not fed (a plain redraw):
        evidence seen before the progress moves on did not end the run."""
        if self._tail_at is not None:
            self._tail_at = None
            self._held.withdraw_tail()
        self._held.note_bar(line)

    @property
    def last_lines(self) -> tuple[tuple[str, int], ...]:
        """The last few lines read that were not progress bars, ``(line, lineno)``: what an
        ``unknown`` failure that printed no exception shows."""
        return tuple(self._reads.last_lines)

    def last_lines_evidence(self, count: int = 3) -> Evidence | None:
        """``unknown`` evidence made of the last lines, for a failure that printed no line of its own."""
        shown = self.last_lines[-count:]
        return ending("\n".join(line for line, _ in shown), shown[0][1], shown[0][1]) if shown else None

    @property
    def last_frame_line(self) -> int:
        """The line number of the newest traceback frame seen (0: none)."""
        return self._tb.last_frame_line

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
        if lineno - found[2] <= STALE_LINES and (
                rank_tag(raw) != rank or not text.strip("^~ ") or FRAME.match(text) is not None
                or self._tb.is_source_line(raw, text, lineno)):
            return None
        self._judge.pending = None
        return self._record(_framed(found))

    def _feed(self, raw_line: str, lineno: int) -> Evidence | None:
        known = self._known.get(raw_line)
        if known is None:
            known = self._prepare(raw_line)
        text, hit, record, bar, wanted, hinted = known
        rows = self._rows
        if not text or record:
            rows.clear()  # nothing before this line can be part of its message
            if not text:
                return None
        if self._tail_at is not None:  # a line follows the wait the log seemed to end at
            self._tail_at = None
            self._held.withdraw_tail()
        reads = self._reads
        if not bar:
            reads.last_lines.append((raw_line, lineno))
        read_ev = None
        if wanted or reads.table:
            read = reads.read(text, raw_line, lineno)
            read_ev = self._record(read) if read is not None else None
        if hinted:
            if self._progress is not None and self._progress.progress(text) is not None:
                self._held.note_bar(text)  # the trainer's own progress (a tqdm bar or not)
            elif bar:
                self._held.draw(text)
        index = self._index
        if not hit and not bar:
            # The common case, an ordinary line holding no key: it can only complete
            # a message that rich wrapped, begun by the rows before it.
            # (a key can straddle two rows only where a word was cut: rich folded it, or a
            # terminal hard-wrapped it; checked inline first)
            if rows and (self._key_row >= rows[0][2]
                         or (_cut(rows[-1]) and index.boundary_hit(rows[-1][0], text))):
                found = self._scan_joined(text, raw_line, lineno)
                if found is not None:
                    rows.clear()
                    return self._record(found) or read_ev
            if len(text) <= _MAX_ROW:
                rows.append((text, raw_line, lineno))
            else:
                rows.clear()
            return read_ev
        tail = None
        if bar:
            if not hinted:
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
        return self._record(ev) or read_ev

    def _prepare(self, raw: str) -> tuple[str, bool, bool, bool, bool, bool]:
        """The line's bare text, whether it holds a key, whether it starts a record, whether it is a
        progress bar, whether ``ending.LineReads`` wants it (see ``wanted``), whether it holds the
        trainer's progress hint.

        All of them depend on the line alone, and rich logs repeat many lines exactly
        (continuation rows, records in the same second print no time), so short
        lines are remembered: a repeat then costs one dict lookup.
        """
        text = clean_line(raw)
        if len(text) > _HEAD + _TAIL:
            text = text[:_HEAD] + "\n" + text[-_TAIL:]
        known = (text, bool(text) and self._index.hit(text), starts_record(raw), "%|" in text, wanted(text),
                 any(h in text for h in self._hints))
        if len(raw) <= _MAX_ROW:
            if len(self._known) >= _KNOWN_LINES:
                self._known.clear()  # a crude bound; the lines worth keeping come back quickly
            self._known[raw] = known
        return known

    def _scan(self, text: str, raw: str, lineno: int) -> tuple[Evidence | None, bool]:
        """Slow path for a line holding a key: traceback structure, status, then rules."""
        candidates = self._index.candidates(text)
        structural = ended = killed = False
        crashed: int | None = None
        for k in candidates:
            owner = self._owner[k]
            if owner == _TB and TRACEBACK.search(text):
                self._tb.header(raw, lineno)
                structural = True
            elif owner == _CHAIN and CHAINED.search(text):
                self._tb.chain(lineno)
            elif owner == _FR and (m := FRAME.match(text)) is not None:
                rank, frames = self._tb.frame(raw, lineno, m.group(1), m.group(2))
                framed = self._judge.frame(frames, rank, lineno, raw)
                return _framed(framed), True
            elif owner == _ST and (status := parse_child_status(text)) is not None:
                self._child = status
                killed = status[1] == 9
                crashed = status[1] if status[1] in CRASH_SIGNALS else None
            elif owner == _END and not ended:
                ended = self._patterns[k].search(text) is not None
        # A frame rule's hint counts in the code the innermost frame quotes too (``te_outputs[prompt]``).
        source = self._tb.is_source_line(raw, text, lineno)
        hinted = None
        if candidates and self._owner[candidates[-1]] <= _HINT:
            hinted = self._note_hints(text, raw, lineno, candidates, source)
        if source:
            return hinted, True  # a traceback quoting code; its exception line follows
        # A launcher's report of its child quotes the child's argv: only its weak wording (the child's
        # fate, a SIGKILL) is evidence there.
        launcher = self._tb.launcher_reports(raw, lineno)
        found = self._match(text, raw, lineno, candidates, weak_only=launcher)
        if crashed is not None:  # a rank's segfault: a cause, as a kill is (see ``Held.verdict``)
            self._held.note_launcher_kill(self._with_table_rank(crash(raw, lineno, crashed)))
        if found is None:
            if ended and hinted is None and not launcher:
                return self._ending(text, raw, lineno), structural
            return hinted, structural
        ev = self._evidence(found[0], raw, lineno, self._tb.in_traceback(raw, lineno), found[2])
        if killed:
            self._held.note_launcher_kill(self._with_table_rank(ev))
        return ev, structural

    def _with_table_rank(self, ev: Evidence) -> Evidence:
        """A kill in torchrun's failure table, with the row above it that names the rank (``rank : 1
        (local_rank: 1)``): its evidence then says which rank was killed. Any other report, as it is."""
        above = next((raw for raw, n in self._reads.last_lines if n == ev.lineno - 1), None)
        if above is None or _TABLE_RANK.match(clean_line(above)) is None:
            return ev
        return replace(ev, line=f"{above}\n{ev.line}", lineno=ev.lineno - 1)

    def _evidence(self, rule: FaultRule, line: str, lineno: int, anchored: bool,
                  groups: dict[str, str]) -> Evidence:
        return Evidence(rule.id, line, lineno, rule.strength, anchored, explanation=rule.explanation,
                        cause=rule.first_cause, kind="tail" if rule.tail else "", groups=groups,
                        consequence=rule.consequence)

    def _ending(self, text: str, raw: str, lineno: int) -> Evidence | None:
        """``unknown`` evidence for an exception line or a signal death no rule names (see ``ending``)."""
        m = EXCEPTION.match(text)
        if self._refuted or (m is not None and m.group("type") in LAUNCHER_EXCEPTIONS) \
                or any(x.search(text) for x in _IGNORED):
            return None  # a known look-alike, a launcher's report of its child, a warning
        if m is None:  # a signal death says nothing: what was printed just before it explains it
            return ending(raw, lineno, max(1, lineno - STALE_LINES))
        return ending(raw, lineno, self._tb.began(raw, lineno))

    def _note_hints(self, text: str, raw: str, lineno: int, candidates: list[int], code: bool) -> Evidence | None:
        """Remember the frame rules' hints on this line; judge the frames in sight by them."""
        rank = rank_tag(raw)
        for k in candidates:
            j = _HINT - self._owner[k]
            if j >= 0 and self._patterns[k].search(text) is not None:
                framed = self._judge.hint(j, lineno, rank, raw, self._tb.by_rank, code)
                if framed is not None:
                    return _framed(framed)
        return None

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
                                self._tb.launcher_reports(rows[0][1], rows[0][2]))
            if found is not None:
                first = max(i for i, s in enumerate(starts) if s <= found[1])
                line = "\n".join([r[1] for r in rows[first:]] + [raw])
                start = rows[first][2]
                return self._evidence(found[0], line, start, self._tb.in_traceback(rows[first][1], start), found[2])
        return None

    def _match(self, text: str, raw: str, lineno: int, candidates: list[int], boundary: int | None = None,
               starts: Sequence[int] = (0,), weak_only: bool = False
               ) -> tuple[FaultRule, int, dict[str, str]] | None:
        """The first rule in table order with a candidate pattern that matches unrefuted,
        with where the match starts and the named groups it captured (those that took part).
        For joined rows (``starts``: where each row begins) the match must span the last
        join, and only the rows it spans are checked for warnings and excludes."""
        refuted = -1
        self._refuted = False
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
            if any(x.search(own) for x in self._lookalikes[i]):
                refuted = i  # harmless output in this rule's words: no failure either
                self._refuted = True
                continue
            if any(x.search(own) for x in self._excludes[i]) or not self._frames_allow(i, raw, lineno):
                refuted = i  # this rule is refuted for the line; later rules may still match
                continue
            return self._rules[i], m.start(), {k: v for k, v in m.groupdict().items() if v is not None}
        return None

    def _frames_allow(self, i: int, raw: str, lineno: int) -> bool:
        """Judge a frame-checked rule by the frames of the traceback the message ends."""
        require, exclude, forbid = self._frames_require[i], self._frames_exclude[i], self._frames_forbid[i]
        if not require and not exclude and not forbid:
            return True
        frames = self._tb.in_sight(raw, lineno)
        if frames is None:
            return not self._rules[i].frames_needed  # no traceback in sight: the message alone decides
        verdict = judge(frames, require, exclude, forbid)
        return not require if verdict is None else verdict  # frames in sight, none of either kind

    def _record(self, ev: Evidence | None) -> Evidence | None:
        if ev is None:
            return None
        ev = self._held.record(ev)
        if ev.kind == "tail":
            self._tail_at = ev.lineno
        if ev.kind == "ending" or ev.fault in self._seen:  # (an ending is a verdict, not a fault's evidence)
            return None
        self._seen[ev.fault] = ev
        return ev


def classify_text(lines: Iterable[str], rules: Sequence[FaultRule] = BUILTIN_RULES,
                  progress: ProgressFormat | None = None) -> Evidence | None:
    """The verdict for a finished log; an item may hold several ``\\n``/``\\r`` separated lines."""
    scanner = FaultScanner(rules, progress)
    lineno = 0
    for chunk in lines:
        for line in re.split(r"\r\n|\r|\n", chunk.rstrip("\r\n")):
            lineno += 1
            scanner.feed(line, lineno)
    return scanner.verdict
