"""Benchmark: how long the page takes to show a run with a very long curve, first and on each refresh.

Writes a run dir as a supervisor leaves it after ``--steps`` steps (``progress.jsonl`` with one
point a step over three attempts, a journal with their faults and remedies, a status snapshot),
then, through the page's own app (Flask's test client, no network), times:

- the first look at the run's live part (``/part/run/ID``): the whole ``progress.jsonl`` is read
  and the curve downsampled;
- a refresh with nothing new (what the page asks every second while the run is idle);
- a refresh after 100 more steps were appended (what it asks while the run trains);
- the runs list's live part (``/part/runs``).

    python benchmarks/web_page.py [--steps 300000] [--reps 5]

Prints the median of each in milliseconds and the points the loss curve draws.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "supervisor"))

from trainsup.service.queuestore import QueueStore
from trainsup.web.app import create_app
from trainsup.web.auth import Guard, load_token
from trainsup.web.runs import Catalog, run_id

HOST = {"Host": "127.0.0.1:8470"}


def write_run(run_dir: Path, steps: int) -> None:
    run_dir.mkdir(parents=True)
    t0 = 1_790_000_000.0
    thirds = (0, steps // 3, 2 * steps // 3)
    events = [{"ts": t0, "event": "run_start", "project": "bench", "trainer": "kohya"}]
    with open(run_dir / "progress.jsonl", "w") as fh:
        for attempt, start in enumerate(thirds, 1):
            events.append({"ts": t0 + start, "event": "attempt_start", "attempt": attempt,
                           "resume_step": max(0, start - 50), "resume_from": "x" if start else None})
            end = thirds[attempt] if attempt < 3 else steps
            fh.writelines(json.dumps({"ts": t0 + s, "a": attempt, "s": s, "t": steps,
                                     "l": 1.0 / (1 + s / 1000), "r": 3.1}, separators=(",", ":")) + "\n"
                          for s in range(max(0, start - 50) + 1, end + 1))
            if attempt < 3:
                events += [{"ts": t0 + end, "event": "attempt_end", "attempt": attempt, "step": end, "exit_code": 1},
                           {"ts": t0 + end, "event": "fault", "class": "cuda_oom", "attempt": attempt},
                           {"ts": t0 + end, "event": "remedy", "class": "cuda_oom", "actions": ["add --x"]}]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "status.json").write_text(json.dumps({"state": "finished", "step": steps, "total": steps,
                                                      "attempt": 3, "updated": t0 + steps}))


def timed(fn: object, reps: int) -> float:
    samples = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "out" / ".trainsup"
        write_run(run_dir, args.steps)
        size = (run_dir / "progress.jsonl").stat().st_size
        token, _ = load_token(Path(tmp) / "state")
        store = QueueStore(Path(tmp) / "state")

        def fresh() -> object:
            catalog = Catalog({"TRAINSUP_PROJECTS": str(Path(tmp) / "p")}, store, [run_dir])
            return create_app(catalog, Guard(token, "127.0.0.1", 8470), store, {}).test_client()

        part = f"/part/run/{run_id(run_dir.resolve())}"
        first = timed(lambda: fresh().get(part, headers=HOST), args.reps)
        client = fresh()
        body = client.get(part, headers=HOST).get_data(as_text=True)
        points = re.search(r'data-points="(\d+)"', body)
        idle = timed(lambda: client.get(part, headers=HOST), args.reps)
        last = [args.steps]

        def grow() -> None:
            with open(run_dir / "progress.jsonl", "a") as fh:
                fh.writelines(json.dumps({"ts": 1.0 * s, "a": 3, "s": s, "l": 0.1}) + "\n"
                              for s in range(last[0] + 1, last[0] + 101))
            last[0] += 100
            client.get(part, headers=HOST)

        growing = timed(grow, args.reps)
        listing = timed(lambda: client.get("/part/runs", headers=HOST), args.reps)
    print(f"progress.jsonl: {args.steps} steps, {size / 1e6:.1f} MB; the curve draws "
          f"{points.group(1) if points else '?'} points")
    print(f"first look {first:.0f} ms; refresh, nothing new {idle:.1f} ms; refresh after 100 steps "
          f"{growing:.1f} ms; runs list {listing:.1f} ms (medians of {args.reps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
