"""The pasted-log corpus (tests/corpus): every excerpt through `trainsup diagnose`, as a user runs it.

Each excerpt was written here, modelled on a public thread where someone pasted a console log (the
manifest names the thread, the class, the forms it was pasted in, and why). `diagnose` must name
the manifest's class for every one of them (null for a log with no fault), and never answer a class
that has no setting remedy (`config_error`, `missing_dependency`, `disk_full`, no fault) with a
flag, config, environment or package change.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, trainsup_cmd
from tests.corpus import CORPUS, FORMS, LOGS, NO_SETTING_REMEDY, Excerpt, false_fix, load
from trainsup.faults.rules import FAULT_IDS
from trainsup.trainers.registry import family_rules

EXCERPTS = load()
HOLDOUT = CORPUS / "holdout2"
THREAD = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull|discussions)/\d+$")
CLASSES = {*FAULT_IDS, *(r.id for r in family_rules())}
# What the issue asks of the corpus: its size, the classes and the forms it covers.
AT_LEAST_PER_CLASS = 5


@pytest.fixture(scope="module")
def diagnoses() -> dict[str, dict[str, Any]]:
    import subprocess

    done = subprocess.run(trainsup_cmd("diagnose", "--json", *(str(e.path) for e in EXCERPTS)), cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    found = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return {d["file"]: d for d in found}


def test_every_excerpt_is_in_a_manifest_once_with_a_thread_a_known_class_and_its_forms() -> None:
    names = [e.path.name for e in EXCERPTS]
    assert sorted(names) == sorted(p.name for p in LOGS.glob("*.log")), "a log without an entry, or the reverse"
    assert len(names) == len(set(names)), [n for n, c in Counter(names).items() if c > 1]
    for e in EXCERPTS:
        assert e.fault is None or e.fault in CLASSES, (e.path.name, e.fault)
        assert e.path.name.split("__", 1)[0] == (e.fault or "clean"), e.path.name
        assert THREAD.match(e.source), (e.path.name, e.source)
        assert set(e.forms) <= FORMS and e.forms, (e.path.name, e.forms)
        assert e.why.strip() and e.trainer in {"kohya", "onetrainer", "litgpt", "comfyui", "fluxgym", "other"}
    # One thread inspires at most two excerpts.
    assert max(Counter(e.source for e in EXCERPTS).values()) <= 2


def test_the_corpus_covers_every_class_and_form_the_issue_asks_for() -> None:
    assert len(EXCERPTS) >= 150
    by_class = Counter(e.fault for e in EXCERPTS)
    assert by_class[None] >= 20  # clean runs and look-alikes
    for cls in CLASSES - {"unknown"}:
        assert by_class[cls] >= AT_LEAST_PER_CLASS, f"{cls}: {by_class[cls]} excerpts"
    by_form = Counter(f for e in EXCERPTS for f in e.forms)
    for form in FORMS - {"plain"}:
        assert by_form[form] >= 10, f"{form}: {by_form[form]} excerpts"


@pytest.mark.parametrize("excerpt", EXCERPTS, ids=[e.path.stem for e in EXCERPTS])
def test_diagnose_names_the_class_of_every_excerpt(excerpt: Excerpt, diagnoses: dict[str, dict[str, Any]]) -> None:
    got = diagnoses[str(excerpt.path)]
    assert got["fault"] == excerpt.fault, f"{excerpt.path.name} ({excerpt.source}): {got.get('evidence')}"


def test_no_excerpt_without_a_setting_remedy_gets_a_setting_changed(diagnoses: dict[str, dict[str, Any]]) -> None:
    fixed = [(e.path.name, diagnoses[str(e.path)]["remedy"]) for e in EXCERPTS
             if e.fault in NO_SETTING_REMEDY and false_fix(diagnoses[str(e.path)])]
    assert not fixed


def test_the_held_out_set_is_whole_and_shares_no_thread_with_the_tuning_corpus() -> None:
    """tests/corpus/holdout2 (issue 35): its shape is checked, never its answers (a held-out set that a
    test asserts on is tuned on); its threads are not the tuning corpus's."""
    held = load(HOLDOUT)
    assert len(held) >= 60
    assert sorted(e.path.name for e in held) == sorted(p.name for p in (HOLDOUT / "logs").glob("*.log"))
    tuning = {e.source for e in EXCERPTS}
    for e in held:
        assert e.path.name.split("__", 1)[0] == (e.fault or "clean") and (e.fault is None or e.fault in CLASSES)
        assert THREAD.match(e.source) and e.source not in tuning, (e.path.name, e.source)
        assert set(e.forms) <= FORMS | {"notebook"} and e.forms and e.why.strip(), e.path.name
    assert len({e.source for e in held}) == len(held)  # one excerpt a thread


def test_a_requirement_on_another_package_names_the_exact_pip_command(diagnoses: dict[str, dict[str, Any]]) -> None:
    """`missing_dependency` from an import-time version check says how to install what is required."""
    checked = 0
    for e in EXCERPTS:
        text = Path(e.path).read_text(encoding="utf-8", errors="replace")
        wanted = re.search(r"([A-Za-z0-9_.-]+(?:[<>=!]=?[\w.]+)(?:,[<>=!]=?[\w.]+)*) is required for a normal", text)
        if e.fault != "missing_dependency" or wanted is None:
            continue  # transformers' dependency check; other wordings print their own pip command
        said = json.dumps(diagnoses[str(e.path)])
        assert f"pip install '{wanted[1]}'" in said or f'pip install \\"{wanted[1]}\\"' in said, (e.path.name, said)
        checked += 1
    assert checked >= 4
