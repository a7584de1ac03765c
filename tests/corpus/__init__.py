"""The pasted-log corpus (issue 22): excerpts in ``logs/``, each written here and modelled on a public
thread, described by the manifests in ``manifest/*.yaml`` (one per part; each entry: ``file``,
``class`` (a fault id, or null for a log with no fault), ``trainer``, ``forms``, ``source`` (the
thread), ``why``). This module reads them strictly, for ``tests/unit/test_corpus.py`` and
``benchmarks/corpus_accuracy.py``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).resolve().parent
LOGS = CORPUS / "logs"

# The ways people paste a fault that the classifier must see through (the list).
FORMS = frozenset({"plain", "cut_traceback", "launcher_after", "windows_paths", "markdown_quote", "code_fence",
                   "rich_wrapped", "interleaved_ranks", "gui_prefix", "ansi", "te_cache_wording",
                   "import_requirement"})
# True classes with no setting remedy: diagnose must never answer them with a flag, config,
# environment or package change (None: a log with no fault).
NO_SETTING_REMEDY = frozenset({"config_error", "missing_dependency", "disk_full", None})


@dataclass(frozen=True)
class Excerpt:
    path: Path
    fault: str | None  # None: no fault
    trainer: str
    forms: tuple[str, ...]
    source: str
    why: str
    manifest: str


def load(corpus: Path = CORPUS) -> list[Excerpt]:
    """Every manifest entry, in manifest order; raises TypeError or ValueError on a manifest that is not whole."""
    out: list[Excerpt] = []
    for manifest in sorted((corpus / "manifest").glob("*.yaml")):
        doc: Any = yaml.safe_load(manifest.read_text(encoding="utf-8"))
        if not isinstance(doc, list):
            raise TypeError(f"{manifest.name}: expected a list of entries")
        for i, e in enumerate(doc, 1):
            missing = [k for k in ("file", "class", "trainer", "forms", "source", "why") if k not in e]
            if missing:
                raise ValueError(f"{manifest.name} entry {i}: no {', '.join(missing)}")
            forms = e["forms"] if isinstance(e["forms"], list) else [e["forms"]]
            out.append(Excerpt(corpus / "logs" / str(e["file"]), None if e["class"] is None else str(e["class"]),
                               str(e["trainer"]), tuple(str(f) for f in forms), str(e["source"]), str(e["why"]),
                               manifest.name))
    return out


def false_fix(diagnosis: dict[str, Any]) -> bool:
    """Whether diagnose proposes a change of settings: a flag, the config, the environment or a package
    (stopping, or restarting with the same settings, changes none)."""
    remedy = diagnosis.get("remedy") or []
    return bool(diagnosis.get("command_changed")) or any(not str(r).startswith(("stop", "restart")) for r in remedy)
