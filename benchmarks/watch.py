"""Benchmark: how soon after an edit of a watched file does the journal record it?

Runs `trainsup run` over an idle child with `--sample_prompts P`, edits P 20 times (alternating
atomic rename-over and in-place writes, 0.4 s apart), and measures each edit -> `file_changed`
latency by polling the journal. Prints the median; the target is under 300 ms.

    python benchmarks/watch.py [--edits 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def count_changes(journal: Path) -> int:
    try:
        lines = journal.read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for x in lines if json.loads(x)["event"] == "file_changed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--edits", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        prompts = base / "prompts.txt"
        prompts.write_text("a cat --w 512 --h 512\n")
        run_dir = base / "run"
        journal = run_dir / "events.jsonl"
        proc = subprocess.Popen([sys.executable, "-m", "trainsup.cli", "run", "--quiet", "--run-dir", str(run_dir),
                                 "--", sys.executable, str(HERE / "idle_child.py"), str(args.edits * 0.5 + 10),
                                 "--output_dir", str(base / "out"), "--sample_prompts", str(prompts)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while "attempt_start" not in (journal.read_text() if journal.exists() else ""):
                if time.monotonic() > deadline:
                    raise SystemExit("trainsup did not start")
                time.sleep(0.05)
            time.sleep(0.5)  # the watcher is scheduled before the first launch; let it settle
            latencies = []
            for i in range(args.edits):
                seen = count_changes(journal)
                text = f"a cat number {i} --w 512 --h 512\n"
                start = time.perf_counter()
                if i % 2:
                    tmp_file = base / ".prompts.txt.tmp"
                    tmp_file.write_text(text)
                    os.replace(tmp_file, prompts)
                else:
                    with open(prompts, "r+") as fh:
                        fh.truncate(0)
                        fh.write(text)
                while count_changes(journal) == seen:
                    if time.perf_counter() - start > 5:
                        raise SystemExit(f"edit {i} was not journaled within 5 s")
                    time.sleep(0.002)
                latencies.append(time.perf_counter() - start)
                time.sleep(0.4)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    ms = sorted(x * 1000 for x in latencies)
    print(f"edit -> file_changed over {len(ms)} edits: median {statistics.median(ms):.0f} ms, "
          f"min {ms[0]:.0f} ms, max {ms[-1]:.0f} ms (debounce 100 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
