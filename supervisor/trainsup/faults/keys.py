"""The prefilter of the fault scanner: literal keys derived from regexes, and the index over them.

Nearly every line a trainer prints is a progress bar or an info log, and checking it must cost a
few microseconds at most.  Each pattern gets keys derived from its regex: literals one of which
every match contains (a substring starting at an uncommon character, all checked by one
trie-shaped regex that the engine skips through quickly, or a whole word, checked by one
``split``).  ``KeyIndex.hit`` says whether a line can match any pattern at all and
``KeyIndex.candidates`` which patterns to try; ``scanner.FaultScanner`` owns what happens then.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Key", "KeyIndex", "is_cut", "is_folded", "pattern_keys"]


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


def is_folded(row: str) -> bool:
    """Whether a row is a piece of a word that rich folded over several rows.

    rich wraps at spaces and breaks only a word longer than its column; that word
    starts a fresh row, so each of its pieces fills a row without any space.
    """
    return len(row) >= _FOLD_MIN and " " not in row


# A terminal's (or a console copy's) hard wrap cuts a row at its width, mid-word.
_TERM_WIDTHS = frozenset({80, 100, 120, 160})


def is_cut(row: tuple[str, str, int]) -> bool:
    """Whether a remembered row (text, raw, lineno) may end in a word cut in two: rich folded it, or a
    terminal hard-wrapped it (the row is as wide as a terminal, ends in a letter or digit, and no source
    column was dropped)."""
    text, raw = row[0], row[1]
    return is_folded(text) or (len(raw) in _TERM_WIDTHS and raw[-1:].isalnum() and raw.endswith(text))


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
        """Whether a key could straddle the join of ``a`` and ``b``, with or without a space (the caller
        asks only where a word may be cut at the join: a folded row, a terminal's hard wrap)."""
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
