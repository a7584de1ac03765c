"""Benchmark: a seeded chaos soak of `trainsup run` over the demo trainer (issue 12).

Each run trains the demo (20 steps, a state every 4, a sample every 5, 0.05 s of pacing a step, 0.3 s
a state save) under `trainsup run --quiet` and injects one to three faults at random moments, all
drawn from the run's own seed:

- `kill_trainer`: SIGKILL of the trainer's processes; some aimed inside a state save (a state dir
  seen without its last file: `TRAINSUP_DEMO_SAVE_SECONDS` paces the demo's saves), some at launch;
- `kill_supervisor`: SIGKILL of trainsup, then `trainsup run` again on the same command after a
  random delay (0-7 s: an orphan trainer has to die on its own, or be stopped by the successor);
- `freeze`: SIGSTOP of the trainer while it trains (policy `hang.min_timeout_s: 5`); trainsup finds
  the hang, stops the tree and resumes;
- `disk_full`: the output dir is a tmpfs of its own; a filler file leaves a few KiB free, mostly
  while a state is being saved; trainsup stops (`disk_full`, exit 4), the filler is deleted and
  `trainsup run` started again;
- `edit`: a caption of the run's own dataset copy or its prompt file rewritten mid-run.

After each run, violations of six invariants are counted:
1. finished runs end with the weights of an uninterrupted run (max abs diff <= 1e-4). The demo reads
   captions once at launch, so a caption edit reaches training only through a later launch: such a
   run is compared with a reference chained the same way (each segment of the run's resume lineage
   trained from the same step with the captions its attempt read);
2. no file of the output dir present before an injection changed or vanished, except a save in
   progress at that moment, the final-weights publish and the demo's append-only sample record;
   the dataset, prompt file and base model hold exactly what the benchmark wrote;
3. every resume (`attempt_start` with `resume_from`) came from a state that is complete (every file
   loads) and whose save no injection interrupted, and that the ledger lists and does not mark bad;
4. a killed supervisor's trainer died within 5 s (README: its next output line), unless it was a
   silent one the next supervisor stopped before launching (`orphan_stopped`); never two trainers
   on one output dir (process table sampled every 50 ms); none left after the last supervisor;
5. `events.jsonl` parses line by line and ends with `finished`; a `gave_up` only for the injected
   `disk_full`; each supervisor's exit code matches its journaled end;
6. no `Traceback (most recent call last)` in trainsup's stderr (with `--quiet` the trainer's output
   is not echoed there) and no internal-error exit 70.

    python benchmarks/chaos.py --runs 50 --seed 1 [--kinds kill_trainer,freeze] [--json] [--keep]
    python benchmarks/chaos.py --replay RUN_SEED [--kinds ...]     # one run, as printed

Exit 0 only with zero violations. `disk_full` needs `mount -t tmpfs` (root); refused, the kind is
skipped with a line on stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from chaos_soak.checks import check
from chaos_soak.driver import ChaosRun, can_mount
from chaos_soak.params import KINDS
from chaos_soak.plan import run_seeds
from chaos_soak.references import References
from chaos_soak.report import print_table, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replay", type=int, metavar="RUN_SEED", help="run only the run of this seed")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {', '.join(KINDS)}")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object, last line")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (kept anyway on violations)")
    args = parser.parse_args()
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        parser.error(f"--kinds: unknown {unknown or 'empty'} (known: {', '.join(KINDS)})")
    from trainsup.demo.make_assets import make_assets

    began = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="trainsup-chaos-"))
    skipped: list[str] = []
    if "disk_full" in kinds:
        why = can_mount(work)
        if why:
            print(f"chaos: disk_full skipped: cannot mount a tmpfs ({why})", file=sys.stderr)
            kinds = tuple(k for k in kinds if k != "disk_full")
            skipped.append("disk_full")
            if not kinds:
                return 0
    assets = make_assets(work / "assets")
    refs = References(work, assets)
    seeds = [args.replay] if args.replay is not None else run_seeds(args.seed, args.runs, kinds)
    kinds_arg = "" if kinds == KINDS else f" --kinds {','.join(kinds)}"
    runs: list[ChaosRun] = []
    for index, run_seed in enumerate(seeds):
        run = ChaosRun(index, run_seed, kinds, work, assets, refs)
        runs.append(run)
        t0 = time.monotonic()
        print(f"run {index + 1}/{len(seeds)} seed {run_seed} (replay: python benchmarks/chaos.py --replay "
              f"{run_seed}{kinds_arg}): {'; '.join(i.describe() for i in run.plan)}", flush=True)
        try:
            run.prepare(tmpfs="disk_full" not in skipped)
            run.run()
            check(run)
        finally:
            run.cleanup(keep=bool(run.violations) or args.keep)
        fired = [i for i in run.plan if i.fired and not i.note]
        print(f"  {len(fired)} injected, {len(run.sups)} supervisor(s), exit {run.sups[-1].rc}, "
              f"{len(run.violations)} violation(s), {time.monotonic() - t0:.0f} s", flush=True)
        for v in run.violations:
            print(f"  VIOLATION invariant {v.invariant} ({v.kind}): {v.detail}", flush=True)
        for inj in run.plan:
            if inj.note:
                print(f"  note: {inj.describe()}: {inj.note}", flush=True)
    summary = report(runs, kinds, args.seed, time.monotonic() - began, skipped, refs.runs)
    print_table(summary)
    if summary["violations"] or args.keep:
        print(f"work dir kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(summary))
    return 0 if summary["violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
