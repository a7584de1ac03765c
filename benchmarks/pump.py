"""Benchmark: does supervising slow the trainer's output down?

Times one child writing >= 200 MB of kohya-like output (log lines and `\\r` bar updates) run
(a) piped into `cat > /dev/null` and (b) through `trainsup run` (log file, console pass-through to
/dev/null, parsing), alternating, several repetitions, and prints the median ratio b/a.

    python benchmarks/pump.py [--mb 200] [--reps 5]
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


def timed(cmd: list[str] | str, env: dict[str, str], shell: bool = False) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, shell=shell, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="250")
    child = [sys.executable, str(HERE / "flood_child.py"), str(args.mb)]
    baseline, supervised = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            run_dir = Path(tmp) / f"run{rep}"
            shell_cmd = " ".join(child) + " 2>&1 | cat > /dev/null"
            baseline.append(timed(shell_cmd, env, shell=True))
            supervised.append(timed([sys.executable, "-m", "trainsup.cli", "run", "--run-dir", str(run_dir),
                                     "--", *child, "--output_dir", str(run_dir / "out")], env))
            log = run_dir / "attempt-1.log"
            end = next(json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()
                       if '"attempt_end"' in x)
            print(f"rep {rep + 1}: cat {baseline[-1]:.2f}s  trainsup {supervised[-1]:.2f}s  "
                  f"ratio {supervised[-1] / baseline[-1]:.3f}  log {log.stat().st_size / 1e6:.0f} MB  "
                  f"parse skipped {end['skipped_lines']} lines (counted, log complete)", flush=True)
    ratios = [s / b for s, b in zip(supervised, baseline)]
    print(f"median ratio trainsup/cat over {args.reps} reps of {args.mb} MB: {statistics.median(ratios):.3f} "
          f"(cat median {statistics.median(baseline):.2f}s, trainsup median {statistics.median(supervised):.2f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
