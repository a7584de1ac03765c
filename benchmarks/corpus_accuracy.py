"""Accuracy of `trainsup diagnose` on the pasted-log corpus (issue 22), per class and per form.

Reads every manifest under ``tests/corpus/manifest/*.yaml`` (``tests/corpus``'s reader; ``class:
null`` means no fault), runs ``trainsup diagnose --json`` once over all the excerpts, and prints
right/total per class and per form, then each miss.  A *false fix* is an excerpt whose true class has
no setting remedy (``config_error``, ``missing_dependency``, ``disk_full``, clean) that diagnose
answers with a flag, config, environment or package change (a stop, or a restart with the same
settings, is none).  An excerpt diagnose gives no answer for (or an error) is a miss.

    python benchmarks/corpus_accuracy.py [--corpus tests/corpus] [--manifest holdout.yaml] [--misses]

``--manifest NAME`` (repeatable) counts only the entries of those manifests (``holdout.yaml``: the
held-out set).  diagnose runs as ``python -m trainsup.cli`` in a child that inherits the environment,
so an older classifier is measured on this corpus with its tree first on the path::

    git worktree add ../wt-before 799022b
    PYTHONPATH=../wt-before/supervisor python benchmarks/corpus_accuracy.py

The first line names the ``trainsup`` package the child imported, so the figures say which code
they are for.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.corpus import NO_SETTING_REMEDY, false_fix, load  # the manifests' one reader


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=ROOT / "tests" / "corpus")
    ap.add_argument("--manifest", action="append", metavar="NAME",
                    help="count only this manifest's entries (repeatable; e.g. holdout.yaml)")
    ap.add_argument("--misses", action="store_true", help="print each miss with its evidence")
    args = ap.parse_args()
    entries = load(args.corpus)
    if args.manifest:
        entries = [e for e in entries if e.manifest in args.manifest]
    if not entries:
        print("no excerpts found")
        return 1
    # The child's import path decides which classifier is measured (PYTHONPATH may put an old tree
    # first): name it, so a before/after pair can be checked to be two different trees.
    where = subprocess.run([sys.executable, "-c", "import trainsup; print(trainsup.__file__)"],
                           capture_output=True, text=True, check=False, cwd=ROOT)
    print(f"classifier: {where.stdout.strip() or where.stderr.strip()}")
    cmd = [sys.executable, "-m", "trainsup.cli", "diagnose", "--json", *(str(e.path) for e in entries)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    results = {json.loads(line)["file"]: json.loads(line) for line in done.stdout.splitlines() if line.strip()}
    by_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_form: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    misses, fixes, right = [], [], 0
    for e in entries:
        obj = results.get(str(e.path), {})
        # No answer is a miss, not a clean verdict (a crash must not count as right for a clean log).
        got = obj.get("fault") if "fault" in obj else "(no answer)"
        ok = got == e.fault
        right += ok
        for bucket in (by_class[e.fault or "clean"], *(by_form[f] for f in e.forms)):
            bucket[0] += ok
            bucket[1] += 1
        if not ok:
            misses.append((e, got, obj))
        if e.fault in NO_SETTING_REMEDY and false_fix(obj):
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
        print(f"miss: {e.path.name}: want {e.fault}, got {got}")
        if args.misses and obj.get("evidence"):
            print("      evidence: " + str(obj["evidence"]).split("\n")[0][:160])
    for e, obj in fixes:
        print(f"false fix: {e.path.name}: {obj.get('remedy')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
