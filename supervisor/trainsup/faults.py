"""Streaming fault classification of one attempt's output, and of how it ended.

``FaultScanner.feed`` sees every output line of an attempt (stdout and stderr
interleaved, split on ``\\n`` and ``\\r``) and reports new evidence at once, so the
supervisor can journal it or act on live faults while the child still runs.  The
verdict is the first root-strength evidence: launcher noise that follows the real
traceback (accelerate's ``CalledProcessError``, torchrun's ``ChildFailedError``)
never overrides it.  ``classify_exit`` combines the verdict with the exit status.

Cost: nearly every line is a progress bar or an info log, and those must cost a
few microseconds at most.  Each pattern gets keys derived from its regex: literals one of
which every match contains (a substring starting at an uncommon character, all
checked by one trie-shaped regex that the engine skips through quickly, or a whole
word, checked by one ``split``).  Only lines holding a key reach the patterns, and
only the patterns whose keys they hold.
"""

from __future__ import annotations

import importlib
import itertools
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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
        text = clean_line(raw_line)
        if len(text) > _HEAD + _TAIL:
            text = text[:_HEAD] + "\n" + text[-_TAIL:]
        rows = self._rows
        if not text or starts_record(raw_line):
            rows.clear()  # nothing before this line can be part of its message
            if not text:
                return None
        index = self._index
        hit = index.hit(text)
        if not hit and "%|" not in text:
            # The common case, an ordinary line holding no key: it can only complete
            # a message that rich wrapped, begun by the rows before it.
            if rows and (self._key_row >= rows[0][2] or index.boundary_hit(rows[-1][0], text)):
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


# --- The prefilter: keys derived from the patterns -------------------------------------

def _sre_parser() -> Any:
    # The regex parser is private (re._parser from 3.11, sre_parse before); without
    # it every pattern is tried on every line, which is slow but still correct.
    for name in ("re._parser", "sre_parse"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


_SRE = _sre_parser()
_MAX_KEY = 12
_FOLD_MIN = 16  # narrower than any column rich folds a word in
_LOWER = frozenset("abcdefghijklmnopqrstuvwxyz")
_COMMON = _LOWER | frozenset("0123456789 \t")
_RARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ'\"<>!?*#@$&{}~^`;\\")
# Words too frequent in trainer logs to be worth a key (they would send every
# "loading model" or "caching latents" line down the slow path).
_STOPWORDS = frozenset({
    "loading", "caching", "latents", "memory", "model", "device", "found", "total", "write", "bytes",
    "space", "tensors", "image", "images", "steps", "epoch", "file", "files", "using", "cannot",
    "expected", "object", "weight", "output", "module", "import", "driver", "available", "status",
    "signal", "failed", "failure", "launch", "writing", "required", "directory", "folder", "supported",
    "works", "requires", "dtype",
})
Key = tuple[str, str]  # ("tok", whole word) or ("sub", substring)
_Choice = tuple[float, int, frozenset[Key]]  # (cost, -shortest key length, keys)


def _folded(row: str) -> bool:
    """Whether a row is a piece of a word that rich folded over several rows.

    rich wraps at spaces and breaks only a word longer than its column; that word
    starts a fresh row, so each of its pieces fills a row without any space.
    """
    return len(row) >= _FOLD_MIN and " " not in row


def _no_match(_text: str) -> re.Match[str] | None:
    return None  # stands in for the trie's search when there are no substring keys


def _run_choices(run: str, left: bool, right: bool) -> list[_Choice]:
    """Keys one literal run offers, with what each costs.

    Whole words cost nothing per line once the line is split, but a common word
    sends many lines down the slow path; substrings cost the trie regex a step at
    each position holding their first character, so they should start with one
    that progress bars and info logs rarely hold.
    """
    out: list[_Choice] = []
    words = run.split(" ")
    for i, w in enumerate(words):
        # A word bounded by spaces (or ^/$) inside the run is a whole token of any match.
        if len(w) < 3 or not w.isprintable() or not (i > 0 or left) or not (i < len(words) - 1 or right):
            continue
        if not _LOWER.issuperset(w):  # capitals, digits or punctuation: a rare word
            out.append((0 if len(w) >= 5 else 2.5, -len(w), frozenset({("tok", w)})))
        elif w not in _STOPWORDS:
            out.append((1.2 if len(w) >= 8 else 1.8 if len(w) >= 5 else 3, -len(w), frozenset({("tok", w)})))
    # Substrings stop at a space: then no key can straddle the join of two rows
    # rejoined with a space, and only rows that rich folded mid-word need a look
    # at the seam (see ``boundary_hit``).
    for i, ch in enumerate(run):
        if ch not in _COMMON:
            key = run[i:i + _MAX_KEY].split(" ", 1)[0]
            if len(key) >= 3:
                out.append((1 if ch in _RARE else 2, -len(key), frozenset({("sub", key)})))
    first = run.split(" ", 1)[0][:_MAX_KEY]
    if len(first) >= 4:
        out.append((4, -len(first), frozenset({("sub", first)})))
    return out


def _best_keys(items: list[Any], ci: bool) -> _Choice | None:
    """The cheapest key set, one key of which every match of ``items`` contains."""
    choices: list[_Choice] = []
    run: list[str] = []
    left = at_start = False

    def flush(right: bool) -> None:
        if run:
            choices.extend(_run_choices("".join(run), left, right))
            run.clear()

    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            left = left if run else at_start
            run.append(chr(av).lower() if ci else chr(av))
            at_start = False
            continue
        at_start = False
        if name == "AT":  # zero-width: \b keeps the run going, ^ and $ bound it
            if str(av) in ("AT_BEGINNING", "AT_BEGINNING_STRING"):
                flush(False)
                at_start = True
            elif str(av) in ("AT_END", "AT_END_STRING"):
                flush(True)
            continue
        if _is_space(name, av):  # \s or " +" between words: the run's last word ends here
            flush(True)
            at_start = True
            continue
        flush(False)
        sub: _Choice | None = None
        if name == "BRANCH":
            alts = [_best_keys(list(alt.data), ci) for alt in av[1]]
            picked = [a for a in alts if a is not None]
            if picked and len(picked) == len(alts):
                sub = (max(a[0] for a in picked), max(a[1] for a in picked), frozenset().union(*(a[2] for a in picked)))
        elif name == "SUBPATTERN" and not ((av[1] | av[2]) & re.IGNORECASE):
            sub = _best_keys(list(av[3].data), ci)
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and av[0] >= 1:
            sub = _best_keys(list(av[2].data), ci)
        if sub is not None:
            choices.append(sub)
    flush(False)
    return min(choices, key=lambda c: (c[0], c[1])) if choices else None


def _is_space(name: str, av: Any) -> bool:
    """Whether an item always matches whitespace: ``\\s``, ``\\s+``, ``" +"``."""
    if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
        if av[0] < 1 or len(av[2].data) != 1:
            return False
        name, av = str(av[2].data[0][0]), av[2].data[0][1]
    if name == "LITERAL":
        return bool(av == 32)
    return name == "IN" and [(str(o), str(a)) for o, a in av] == [("CATEGORY", "CATEGORY_SPACE")]


def pattern_keys(pattern: re.Pattern[str]) -> tuple[bool, frozenset[Key]] | None:
    """``(case_insensitive, keys)``: every match contains one of the keys; None if unknown."""
    if _SRE is None:
        return None
    try:
        parsed = _SRE.parse(pattern.pattern)
    except Exception:  # noqa: BLE001 - any trouble parsing only means "no prefilter"
        return None
    ci = bool(pattern.flags & re.IGNORECASE)
    best = _best_keys(list(parsed.data), ci)
    return None if best is None or best[0] > 4 else (ci, best[2])


def _trie_regex(words: Iterable[str]) -> re.Pattern[str] | None:
    """One alternation shaped as a trie; a word extending a shorter one is dropped."""
    root: dict[str, Any] = {}
    for w in sorted(set(words), key=len):
        node = root
        for ch in w:
            if "" in node:
                break
            node = node.setdefault(ch, {})
        else:
            node.clear()
            node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        if "" in node:
            return ""
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items())]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return re.compile(emit(root)) if root else None


class _KeySet:
    """The keys of one case mode, mapped back to the patterns they gate."""

    def __init__(self, keyed: dict[Key, set[int]]) -> None:
        self.token_map = {k[1]: v for k, v in keyed.items() if k[0] == "tok"}
        self.tokens = frozenset(self.token_map)
        subs = {k[1]: v for k, v in keyed.items() if k[0] == "sub"}
        self.rx = _trie_regex(subs)
        self.rx_all = re.compile("(?=(" + self.rx.pattern + "))") if self.rx is not None else None
        self.sub_map: dict[str, set[int]] = {}  # shortest key found by the trie -> patterns
        for k, v in subs.items():
            self.sub_map.setdefault(next(k[:n] for n in range(1, len(k) + 1) if k[:n] in subs), set()).update(v)
        self.width = max((len(k) for k in subs), default=1) - 1

    def hit(self, text: str) -> bool:
        if self.rx is not None and self.rx.search(text) is not None:
            return True
        return bool(self.tokens) and not self.tokens.isdisjoint(text.split())

    def boundary_hit(self, a: str, b: str) -> bool:
        if not _folded(a):
            return False
        if self.rx is not None and self.rx.search(a[-self.width:] + b[: self.width]) is not None:
            return True
        space = b.find(" ")
        return a[a.rfind(" ") + 1:] + (b if space < 0 else b[:space]) in self.tokens

    def candidates(self, text: str, out: set[int]) -> None:
        if self.rx_all is not None:  # every position's key, overlaps included, in one call
            for key in set(self.rx_all.findall(text)):
                out.update(self.sub_map[key])
        if self.tokens:
            for token in self.tokens.intersection(text.split()):
                out.update(self.token_map[token])


class KeyIndex:
    """The prefilter over a list of patterns: which lines, and which patterns, to try.

    Patterns whose keys cannot be derived are tried on every line (correct, slower).
    """

    def __init__(self, patterns: Sequence[re.Pattern[str]]) -> None:
        keyed: tuple[dict[Key, set[int]], dict[Key, set[int]]] = ({}, {})
        always: set[int] = set()
        for n, p in enumerate(patterns):
            keys = pattern_keys(p)
            if keys is None:
                always.add(n)
                continue
            for key in keys[1]:
                keyed[keys[0]].setdefault(key, set()).add(n)
        self._always = frozenset(always)
        self._cs = _KeySet(keyed[0])
        self._ci = _KeySet(keyed[1]) if keyed[1] else None
        self._search = self._cs.rx.search if self._cs.rx is not None else _no_match
        self._tokens = self._cs.tokens

    @property
    def unkeyed(self) -> frozenset[int]:
        """The patterns no key could be derived for: they are tried on every line."""
        return self._always

    def hit(self, text: str) -> bool:
        """Whether any pattern could match ``text`` (never False when one does)."""
        # The case-sensitive checks are spelled out here: this runs on every line.
        if self._search(text) is not None or not self._tokens.isdisjoint(text.split()):
            return True
        return bool(self._always) or (self._ci is not None and self._ci.hit(text.lower()))

    def boundary_hit(self, a: str, b: str) -> bool:
        """Whether a key could straddle the join of ``a`` and ``b``, with or without a space."""
        if self._cs.boundary_hit(a, b):
            return True
        return self._ci is not None and self._ci.boundary_hit(a.lower(), b.lower())

    def candidates(self, text: str) -> list[int]:
        """The indices, ascending, of the patterns that can match ``text``."""
        out = set(self._always)
        self._cs.candidates(text, out)
        if self._ci is not None:
            self._ci.candidates(text.lower(), out)
        return sorted(out)
