"""The journal's kinds (``record.journalkinds``) against the code that writes them and the page that tells
them: every ``.event(KIND, field=...)`` call in the package (and every record a dict literal spells, as
the journal's own ``records_lost``) uses a declared kind and only its declared fields, passes the fields
every record of the kind has, and every declared kind is written somewhere, so the table cannot rot;
``docs/reference/journal.md`` shows the table as ``journalkinds.markdown()`` makes it."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from trainsup.record import journalkinds
from trainsup.record.journalkinds import KINDS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "supervisor" / "trainsup"
JOURNAL_MD = ROOT / "docs" / "reference" / "journal.md"
BEGIN = "<!-- the tables below are made by trainsup.record.journalkinds.markdown() -->"
END = "<!-- end of the tables made by journalkinds -->"


@dataclass
class Write:
    where: str
    kind: str
    given: set[str] = field(default_factory=set)  # fields every record of this call has
    maybe: set[str] = field(default_factory=set)  # fields it passes only sometimes
    whole: bool = False  # a ``**fields`` the source does not spell


def _kind_of(node: ast.expr) -> str | None:
    """A literal kind, or a ``journalkinds`` constant's (``kinds.RUN_START``, ``RUN_START``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    value = getattr(journalkinds, name, None) if name and name.isupper() else None
    return value if isinstance(value, str) else None


def _dict_keys(node: ast.Dict) -> set[str] | None:
    keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return keys if len(keys) == len(node.keys) else None


def _splat(write: Write, value: ast.expr) -> None:
    if isinstance(value, ast.Dict) and (keys := _dict_keys(value)) is not None:
        write.given |= keys
    elif isinstance(value, ast.IfExp) and all(isinstance(v, ast.Dict) and _dict_keys(v) is not None
                                              for v in (value.body, value.orelse)):
        write.maybe |= (_dict_keys(value.body) or set()) | (_dict_keys(value.orelse) or set())  # type: ignore[arg-type]
    else:
        write.whole = True


def writes(source: str, where: str) -> tuple[list[Write], list[str]]:
    """The journal writes in ``source``, and the calls whose kind cannot be read from the source."""
    found: list[Write] = []
    unread: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "event" \
                and node.args:
            kind = _kind_of(node.args[0])
            if kind is None:
                unread.append(f"{where}:{node.lineno}")
                continue
            write = Write(f"{where}:{node.lineno}", kind)
            for kw in node.keywords:
                if kw.arg is None:
                    _splat(write, kw.value)
                else:
                    write.given.add(kw.arg)
            found.append(write)
        elif isinstance(node, ast.Dict):  # a record spelled whole: {"ts": ..., "event": "records_lost", ...}
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "event" and (kind := _kind_of(value)):
                    keys = _dict_keys(node) or set()
                    found.append(Write(f"{where}:{node.lineno}", kind, keys - {"ts", "event"}))
    return found, unread


def problems(found: list[Write]) -> list[str]:
    """What a write does that the table does not declare."""
    out = []
    for w in found:
        kind = KINDS.get(w.kind)
        if kind is None:
            out.append(f"{w.where}: kind {w.kind!r} is not declared in record/journalkinds.py")
            continue
        if extra := (w.given | w.maybe) - kind.names:
            out.append(f"{w.where}: {w.kind}: fields {sorted(extra)} are not declared")
        if w.whole and not kind.dynamic:
            out.append(f"{w.where}: {w.kind}: passes fields whole (**), but the kind is not declared dynamic")
        if not w.whole and (missing := kind.always - w.given):
            out.append(f"{w.where}: {w.kind}: lacks {sorted(missing)}, which the table says every record has "
                       "(mark them `?` if some records lack them)")
    return out


def _package_writes() -> tuple[list[Write], list[str]]:
    found: list[Write] = []
    unread: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "journalkinds.py":
            continue
        more, cannot = writes(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
        found += more
        unread += cannot
    return found, unread


def test_every_write_uses_a_declared_kind_and_its_fields() -> None:
    found, unread = _package_writes()
    assert len(found) > 60  # the walk still finds the writers
    assert not unread, f"journal writes whose kind is neither a literal nor a journalkinds constant: {unread}"
    assert problems(found) == []


def test_every_declared_kind_is_written_somewhere() -> None:
    found, _ = _package_writes()
    assert sorted(set(KINDS) - {w.kind for w in found}) == []


def test_every_kind_has_its_constant_and_every_constant_its_kind() -> None:
    constants = {name: value for name, value in vars(journalkinds).items()
                 if name.isupper() and isinstance(value, str)}
    assert sorted(constants.values()) == sorted(KINDS)
    assert all(name == value.upper() for name, value in constants.items())
    assert journalkinds.END_EVENTS <= set(KINDS) and set(journalkinds.ENDS) <= journalkinds.END_EVENTS


def test_the_checks_see_an_undeclared_kind_field_and_a_missing_field() -> None:
    source = """
journal.event("run_strat", argv=[])
journal.event(kinds.SAVE_PRUNED, dir="d", step=3, size=1)
journal.event("state_saved", dir="d", step=3, label=2)
journal.event("fault", **{"class": "x"}, evidence="e", line=1, attempt=1, **({"gpu": 1} if a else {}))
journal.event("info", **fields)
journal.event(kind_of_mine, message="m")
"""
    found, unread = writes(source, "x.py")
    assert unread == ["x.py:7"]
    said = problems(found)
    assert said[0] == "x.py:2: kind 'run_strat' is not declared in record/journalkinds.py"
    assert said[1] == "x.py:3: save_pruned: fields ['size'] are not declared"
    assert said[2].startswith("x.py:4: state_saved: lacks ['attempt']")
    assert said[3] == "x.py:6: info: passes fields whole (**), but the kind is not declared dynamic"
    assert len(said) == 4  # the fault's literal class and its conditional gpu are both declared


def test_the_reference_page_shows_the_table() -> None:
    text = JOURNAL_MD.read_text(encoding="utf-8")
    assert BEGIN in text and END in text
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == journalkinds.markdown().strip(), (
        "docs/reference/journal.md is behind record/journalkinds.py: "
        "put markdown()'s text between its markers")
