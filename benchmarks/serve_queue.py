"""How promptly and how lightly ``trainsup serve`` works: the time from running ``trainsup queue add``
(its own start-up included) to the entry's supervisor being started (the socket wakes the daemon; without it
the next look is up to a second away), and the daemon's resident memory and whether torch is mapped into it.

    python benchmarks/serve_queue.py [--reps 10]

Each entry is a tiny project (a script that exits at once, ``restart.max: 0``), so what is timed is the
queue, not a trainer. Prints a table, and ``--json`` one object on the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

JOB = "import sys\nsys.exit(0)\n"


def _events(state: Path) -> list[dict[str, object]]:
    path = state / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainsup-queue-bench-") as tmp:
        work = Path(tmp)
        (work / "train_network.py").write_text(JOB)
        project = work / "job.yaml"
        project.write_text(f"command: [{json.dumps(sys.executable)}, train_network.py]\nrun_dir: run\n"
                           "restart:\n  max: 0\n")
        state = work / "state"
        daemon = subprocess.Popen([sys.executable, "-m", "trainsup.cli", "serve", "--state", str(state)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        latencies = []
        try:
            deadline = time.monotonic() + 30
            while not (state / "serve.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            for rep in range(args.reps):
                asked = time.time()  # the user presses enter: the CLI's own start-up counts
                subprocess.run([sys.executable, "-m", "trainsup.cli", "queue", "add", "--state", str(state),
                                str(project)], check=True, capture_output=True)
                entry_id = f"q{rep + 1}"
                while True:
                    started = [e for e in _events(state)
                               if e.get("event") == "entry_started" and e.get("id") == entry_id]
                    if started:
                        latencies.append(float(started[0]["ts"]) - asked)  # type: ignore[arg-type]
                        break
                    time.sleep(0.01)
                while not any(e.get("event") == "entry_ended" and e.get("id") == entry_id for e in _events(state)):
                    time.sleep(0.05)
            proc = psutil.Process(daemon.pid)
            rss_mib = proc.memory_info().rss / 2**20
            maps = Path(f"/proc/{daemon.pid}/maps").read_text()
            torch_loaded = "torch" in maps
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    result = {"reps": len(latencies), "median_start_s": round(statistics.median(latencies), 3),
              "max_start_s": round(max(latencies), 3), "daemon_rss_mib": round(rss_mib, 1),
              "torch_in_daemon": torch_loaded}
    print(f"`trainsup queue add` run -> supervisor started: median {result['median_start_s']} s, "
          f"max {result['max_start_s']} s over {len(latencies)} entries")
    print(f"daemon resident memory: {result['daemon_rss_mib']} MiB; torch mapped: {torch_loaded}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
