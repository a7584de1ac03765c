"""docs/reference/cli.md against the command line itself: every verb (and sub-verb) of trainsup's argparse
parser has its own section there (``## trainsup VERB`` or ``### trainsup VERB SUBVERB``), and every flag and
positional argument of that verb appears in its section, so the reference cannot fall behind the code."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from trainsup import cli

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"
HEADING = re.compile(r"^(#{2,3}) (trainsup(?: [a-z-]+)+)\s*$", re.MULTILINE)


def _verbs(parser: argparse.ArgumentParser,
           path: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every verb path of the parser (``("queue", "add")``) and its own parser; a verb with sub-verbs too."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[(*path, name)] = sub
                found.update(_verbs(sub, (*path, name)))
    return found


def _sections(text: str) -> dict[str, str]:
    """Each ``trainsup ...`` heading's text, up to the next heading of its level or above."""
    marks = list(HEADING.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        level = len(m.group(1))
        end = next((n.start() for n in marks[i + 1:] if len(n.group(1)) <= level), len(text))
        out[m.group(2)] = text[m.end():end]
    return out


def _documented(name: str, section: str) -> bool:
    """A flag is documented as a code span (`--json`, `--to POS`, `-f`); a positional by its metavar."""
    if name.startswith("-"):
        return re.search(r"`" + re.escape(name) + r"(?=[`\s,=])", section) is not None
    return name in section


def test_every_verb_has_its_section() -> None:
    sections = _sections(CLI_MD.read_text(encoding="utf-8"))
    missing = [" ".join(("trainsup", *path)) for path in _verbs(cli._parser())
               if " ".join(("trainsup", *path)) not in sections]
    assert not missing, f"docs/reference/cli.md has no section for {missing}"


def test_every_flag_of_every_verb_is_in_its_section() -> None:
    text = CLI_MD.read_text(encoding="utf-8")
    sections = _sections(text)
    missing: list[str] = []
    for path, parser in _verbs(cli._parser()).items():
        title = " ".join(("trainsup", *path))
        section = sections.get(title, "")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            names = list(action.option_strings) or [str(action.metavar or action.dest)]
            for name in names:
                if not _documented(str(name), section):
                    missing.append(f"{title}: {name}")
    top = text.split("\n## ", 1)[0]
    for action in cli._parser()._actions:
        for name in action.option_strings:
            if name not in ("-h", "--help") and not _documented(name, top):
                missing.append(f"trainsup: {name}")
    assert not missing, "flags missing from docs/reference/cli.md (each in its verb's section): " + ", ".join(missing)


def test_the_checks_see_a_missing_flag() -> None:
    """The test's own reading: a flag named nowhere is found missing, one in a code span is found."""
    assert _documented("--json", "| `--json` | one JSON array |")
    assert _documented("-f", "| `-f`, `--follow` | keep printing |")
    assert _documented("--to", "| `--to POS` | its new place |")
    assert not _documented("--to", "| `--top` | not it |")
    assert not _documented("--force", "queue it anyway with --force")
    assert _documented("PROJECT|RUN_DIR|ID", "    trainsup logs [-f] PROJECT|RUN_DIR|ID")
