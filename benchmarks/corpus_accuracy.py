"""Accuracy of `trainsup diagnose` on the pasted-log corpus (issue 22), per class and per form.

Reads every manifest under ``tests/corpus/manifest/*.yaml`` (entries with ``file``, ``class``,
``forms``; ``class: clean`` means no fault; an excerpt no manifest lists yet is classed by its file
name, ``<class>__<slug>.log``), runs ``trainsup diagnose --json`` once over all the
excerpts, and prints right/total per class and per form, then each miss.  A *false fix* is an
excerpt whose true class has no setting remedy (``config_error``, ``missing_dependency``,
``disk_full``, clean) that diagnose answers with a flag, config, environment or package change (a
stop, or a restart with the same settings, is none).

    python benchmarks/corpus_accuracy.py [--corpus tests/corpus] [--misses]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
NO_SETTING_REMEDY = {"config_error", "missing_dependency", "disk_full", None}


def _entries(doc: Any) -> list[dict[str, Any]]:
    """The excerpt entries of one manifest document, whatever its top-level shape."""
    if isinstance(doc, list):
        return [e for e in doc if isinstance(e, dict) and "file" in e]
    if isinstance(doc, dict):
        if "file" in doc:
            return [doc]
        return [e for v in doc.values() for e in _entries(v)]
    return []


def load(corpus: Path) -> list[dict[str, Any]]:
    out = []
    for manifest in sorted((corpus / "manifest").glob("*.yaml")):
        try:
            docs = list(yaml.safe_load_all(manifest.read_text(encoding="utf-8")))
        except yaml.YAMLError as exc:
            print(f"skipping {manifest.name}: {exc}", file=sys.stderr)
            continue
        for doc in docs:
            for e in _entries(doc):
                path = corpus / "logs" / Path(str(e["file"])).name
                if not path.exists():
                    print(f"{manifest.name}: no such excerpt {e['file']}", file=sys.stderr)
                    continue
                forms = e.get("forms") or []
                forms = [forms] if isinstance(forms, str) else [str(f) for f in forms]
                want = None if str(e.get("class")) in ("clean", "None", "null") else str(e.get("class"))
                out.append({"path": path, "want": want, "forms": forms or ["plain"]})
    listed = {e["path"].name for e in out}
    for path in sorted((corpus / "logs").glob("*.log")):  # an excerpt no manifest lists yet: its name says the class
        if path.name not in listed:
            cls = path.name.split("__", 1)[0]
            out.append({"path": path, "want": None if cls == "clean" else cls, "forms": ["(not in a manifest)"]})
    return out


def false_fix(obj: dict[str, Any]) -> bool:
    """Whether diagnose proposes a change of settings: a flag, the config, the environment or a package
    (stopping, or restarting with the same settings, changes none)."""
    remedy = obj.get("remedy") or []
    return bool(obj.get("command_changed")) or any(not str(r).startswith(("stop", "restart")) for r in remedy)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests" / "corpus")
    ap.add_argument("--misses", action="store_true", help="print each miss with its evidence")
    args = ap.parse_args()
    entries = load(args.corpus)
    if not entries:
        print("no excerpts found")
        return 1
    cmd = [sys.executable, "-m", "trainsup.cli", "diagnose", "--json", *(str(e["path"]) for e in entries)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    results = {json.loads(line)["file"]: json.loads(line) for line in done.stdout.splitlines() if line.strip()}
    by_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_form: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    misses, fixes, right = [], [], 0
    for e in entries:
        obj = results.get(str(e["path"]), {})
        got = obj.get("fault")
        ok = got == e["want"]
        right += ok
        for bucket in (by_class[e["want"] or "clean"], *(by_form[f] for f in e["forms"])):
            bucket[0] += ok
            bucket[1] += 1
        if not ok:
            misses.append((e, got, obj))
        if e["want"] in NO_SETTING_REMEDY and false_fix(obj):
            fixes.append((e, obj))
    total = len(entries)
    print(f"corpus: {right}/{total} right ({100 * right / total:.1f}%), {len(fixes)} false fixes")
    print("per class:")
    for name, (r, t) in sorted(by_class.items()):
        print(f"  {name:22s} {r:3d}/{t:<3d}")
    print("per form:")
    for name, (r, t) in sorted(by_form.items()):
        print(f"  {name:22s} {r:3d}/{t:<3d}")
    for e, got, obj in misses:
        print(f"miss: {e['path'].name}: want {e['want']}, got {got}")
        if args.misses and obj.get("evidence"):
            print("      evidence: " + str(obj["evidence"]).split("\n")[0][:160])
    for e, obj in fixes:
        print(f"false fix: {e['path'].name}: {obj.get('remedy')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
