"""Benchmark: how soon after its timeout is a hang detected, and are slow phases ever taken for one?

(a) Latency: the demo trainer hangs silently at step 7 (`TRAINSUP_DEMO_SIMULATE=hang@7`, 0.1 s a
step, policy `hang.min_timeout_s: 5`). The trainer's last output is the attempt log's modification
time (the log is written as the bytes arrive); the hang is detected when the journal's `fault` event
is written. Latency = detection - last output - timeout; expect about the loop's poll interval
(0.1 s) plus the time `py-spy dump` takes, since the fault is journaled after the stacks.
(b) False hangs: the same policy over runs whose sampling (6 s an image) and saves are slower than the
training timeout; expect 0.

    python benchmarks/hang.py [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

POLICY = "backoff:\n  initial_s: 0.5\n  max_s: 1\nhang:\n  min_timeout_s: 5\n"
TIMEOUT_S = 5.0


def run(work: Path, name: str, assets: dict[str, Path], env: dict[str, str], extra: list[str]) -> Path:
    out = work / name
    policy = work / "policy.yaml"
    policy.write_text(POLICY)
    argv = [sys.executable, "-m", "trainsup.demo.train_network", "--pretrained_model_name_or_path",
            str(assets["model"]), "--train_data_dir", str(assets["dataset"]), "--output_dir", str(out),
            "--output_name", "lora", "--max_train_steps", "12", "--save_every_n_steps", "4", "--save_state",
            "--seed", "1", "--train_batch_size", "2", *extra]
    subprocess.run([sys.executable, "-m", "trainsup.cli", "run", "--quiet", "--policy", str(policy), "--", *argv],
                   env={**os.environ, **env}, check=False, timeout=600, capture_output=True)
    return out / ".trainsup"


def events(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from trainsup.demo.make_assets import make_assets

    work = Path(tempfile.mkdtemp(prefix="trainsup-hang-bench-"))
    assets = make_assets(work / "assets")
    latencies = []
    for rep in range(args.reps):
        run_dir = run(work, f"hang{rep}", assets,
                      {"TRAINSUP_DEMO_SIMULATE": "hang@7", "TRAINSUP_DEMO_STEP_SECONDS": "0.1"}, [])
        fault = next(e for e in events(run_dir) if e["event"] == "fault")
        last_output = (run_dir / "attempt-1.log").stat().st_mtime
        latency = float(str(fault["ts"])) - last_output - TIMEOUT_S
        latencies.append(latency)
        print(f"rep {rep + 1}: {fault['class']} detected {latency:.2f} s after the timeout")
    false_hangs = 0
    for rep in range(args.reps):
        prompts = work / "prompts.txt"
        prompts.write_text("a red fox --w 16 --h 16 --s 3\n")
        run_dir = run(work, f"slow{rep}", assets, {"TRAINSUP_DEMO_SAMPLE_SECONDS": "6",
                                                   "TRAINSUP_DEMO_STEP_SECONDS": "0.1"},
                      ["--sample_prompts", str(prompts), "--sample_every_n_steps", "4"])
        hangs = sum(1 for e in events(run_dir) if e["event"] == "fault" and e["class"] == "hang")
        false_hangs += hangs
        print(f"slow-sampling run {rep + 1}: {hangs} hang(s)")
    print(f"median detection latency after the {TIMEOUT_S:g} s timeout over {args.reps} hangs: "
          f"{statistics.median(latencies):.2f} s; false hangs over {args.reps} slow-sampling runs: {false_hangs}")


if __name__ == "__main__":
    main()
