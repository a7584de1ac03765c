"""Benchmark: a seeded chaos soak of `trainsup run` over the demo trainer or the real one (issue 12).

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
  `trainsup run` started again. Some (moment `journal`) leave not a byte, once the journal's last
  block has under 2 KiB left, SIGKILL trainsup and start it again at once on the disk, which a
  second writer keeps full: the new supervisor's records overflow that block (a write cut part-way)
  and its end has only the journal's reserve;
- `edit`: a caption of the run's own dataset copy or its prompt file rewritten mid-run.

After each run, violations of six invariants are counted:
1. finished runs end with the weights of an uninterrupted run (max abs diff <= 1e-4). The demo reads
   captions once at launch, so a caption edit reaches training only through a later launch: such a
   run is compared with a reference chained the same way (each segment of the run's resume lineage
   trained from the same step with the captions its attempt read);
2. no file of the output dir present before an injection changed or vanished, except a save in
   progress at that moment, the final-weights publish, the demo's append-only sample record, and a
   save trainsup moved out of sight whole (journal `save_hidden`, `state_set_aside`; or pruned later);
   the dataset, prompt file and base model hold exactly what the benchmark wrote;
3. every resume (`attempt_start` with `resume_from`) came from a state that is complete (every file
   loads) and whose save no injection interrupted, and that the ledger lists and does not mark bad;
4. a killed supervisor's trainer died within 5 s (docs/guides/robustness.md: its next output line), unless it was a
   silent one the next supervisor stopped before launching (`orphan_stopped`); never two trainers
   on one output dir (process table sampled every 50 ms); none left after the last supervisor;
5. `events.jsonl` parses line by line (no record cut or glued onto another, whatever the disk did)
   and ends with `finished`; a `gave_up` only for the injected `disk_full`; each supervisor's exit
   code matches its journaled end (so one that stopped on the full disk journaled its end);
6. no `Traceback (most recent call last)` in trainsup's stderr (with `--quiet` the trainer's output
   is not echoed there) and no internal-error exit 70.

    python benchmarks/chaos.py --runs 50 --seed 1 [--kinds kill_trainer,freeze] [--json] [--keep]
    python benchmarks/chaos.py --replay RUN_SEED [--kinds ...]     # one run, as printed

Exit 0 only with zero violations. `disk_full` needs `mount -t tmpfs` (root); refused, the kind is
skipped with a line on stderr.

Real mode, `--real-kohya`: the same soak over the REAL sd-scripts trainer on the CPU bed of the
real-trainer tests (`tests/real/bed.py`; needs `TRAINSUP_SD_SCRIPTS`, e.g.
`/work/shared/realkohya/sd-scripts`). Each run is the user's command, `accelerate launch ...
train_network.py ...` (20 steps, 8 an epoch, a state every 5 steps) with `--max_data_loader_n_workers 1`
(sd-scripts' resume at an epoch's end is then exact), run from the bed's sd-scripts dir under
`trainsup run --quiet`, ONE run at a time (a trainer peaks at ~7 GB). The reference is ONE bare run
of the same command without trainsup, made once per soak and kept in its work dir. One or two
injections a run (4 runs by default), all drawn from the run's seed:

- `kill_trainer`: SIGKILL of train_network.py (not accelerate), at a step between two saves, or
  inside a save: as soon as the weights file of the aimed-at save step appears (`tiny-stepNNNNNNNN
  .safetensors`, or the resumed attempt's own name whose label maps to that step);
- `kill_supervisor`: SIGKILL of trainsup at a step, inside a save or while the trainer loads, then
  `trainsup run` again on the same command after a random delay (0-7 s);
- `freeze`: SIGSTOP of train_network.py while it trains (policy `hang.min_timeout_s: 5`); every
  frozen pid is SIGKILLed in a `finally`, so no frozen trainer is ever left behind.

After each run, violations of five invariants are counted:
1. the run finished: `events.jsonl` parses and ends with `finished`, no `gave_up`, status.json
   `finished`, the last trainsup exited 0;
2. exactly the steps asked for: the last `attempt_start`'s `resume_step` plus the last
   `attempt_end`'s `steps_trained` is 20, no `attempt_end` has `step` > 20, status.json ends at step
   20 of 20;
3. the output dir's visible names (all but `.trainsup`) are exactly the reference's;
4. every `.safetensors` of the reference's output dir and every `*-state/model.safetensors` equals
   the run's of the same name within max |dw| <= `--tolerance` (1e-5); every state's
   `train_state.json` `current_step` is the reference's;
5. no traceback in trainsup's stderr, no exit 70, never two train_network.py on the output dir at
   once (process table sampled every 50 ms; a data loader worker is no trainer), none left after
   the last supervisor.

    TRAINSUP_SD_SCRIPTS=/work/shared/realkohya/sd-scripts \
        python benchmarks/chaos.py --real-kohya [--runs 4] [--seed 1] [--tolerance 1e-5] [--kinds ...]
    python benchmarks/chaos.py --real-kohya --replay RUN_SEED       # one run, as printed
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from chaos_soak.checks import check
from chaos_soak.driver import ChaosRun, can_mount
from chaos_soak.params import INVARIANTS, KINDS, REAL_INVARIANTS, REAL_KINDS, REAL_RUNS, REAL_TOLERANCE
from chaos_soak.plan import run_seeds
from chaos_soak.references import References
from chaos_soak.report import print_table, report

R = TypeVar("R", bound=ChaosRun)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real-kohya", action="store_true", help="soak the real sd-scripts trainer on the CPU bed")
    parser.add_argument("--runs", type=int, help=f"runs (default 10; {REAL_RUNS} with --real-kohya)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replay", type=int, metavar="RUN_SEED", help="run only the run of this seed")
    parser.add_argument("--kinds", help=f"comma list of {', '.join(KINDS)} ({', '.join(REAL_KINDS)} with --real-kohya)")
    parser.add_argument("--tolerance", type=float, help=f"--real-kohya: max |dw| allowed (default {REAL_TOLERANCE:g})")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object, last line")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (kept anyway on violations)")
    args = parser.parse_args()
    known = REAL_KINDS if args.real_kohya else KINDS
    kinds = tuple(k.strip() for k in (args.kinds or ",".join(known)).split(",") if k.strip())
    unknown = [k for k in kinds if k not in known]
    if unknown or not kinds:
        parser.error(f"--kinds: unknown {unknown or 'empty'} (known: {', '.join(known)})")
    if args.tolerance is not None and not args.real_kohya:
        parser.error("--tolerance is for --real-kohya (the demo mode compares within 1e-4)")
    if args.real_kohya:
        return real_soak(args, kinds)
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
    seeds = [args.replay] if args.replay is not None else run_seeds(args.seed, args.runs or 10, kinds)
    kinds_arg = "" if kinds == KINDS else f" --kinds {','.join(kinds)}"
    runs = soak(seeds, lambda index, run_seed: ChaosRun(index, run_seed, kinds, work, assets, refs), check,
                kinds_arg, tmpfs="disk_full" not in skipped, keep=args.keep)
    summary = report(runs, kinds, args.seed, time.monotonic() - began, skipped, refs.runs, INVARIANTS)
    return finish(summary, work, args.keep, args.json)


def real_soak(args: argparse.Namespace, kinds: tuple[str, ...]) -> int:
    """The soak over sd-scripts' train_network.py on the real-trainer bed (one run at a time)."""
    from chaos_soak.real_bed import RealReference, build_bed, visible_names
    from chaos_soak.real_checks import check_real
    from chaos_soak.real_driver import RealRun

    began = time.monotonic()
    bed = build_bed()
    if isinstance(bed, str):
        print(f"chaos: --real-kohya: {bed}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="trainsup-chaos-real-"))
    ref = RealReference(work, bed)
    print(f"reference: one bare run of the bed's command (no trainsup) in {ref.dir}", flush=True)
    try:
        ref_out = ref.out
    except RuntimeError as exc:
        print(f"chaos: {exc}\nwork dir kept: {work}", file=sys.stderr)
        return 2
    print(f"  {ref.seconds:.0f} s: {' '.join(visible_names(ref_out))}", flush=True)
    tolerance = REAL_TOLERANCE if args.tolerance is None else args.tolerance
    seeds = [args.replay] if args.replay is not None else run_seeds(args.seed, args.runs or REAL_RUNS, kinds)
    kinds_arg = " --real-kohya" + ("" if kinds == REAL_KINDS else f" --kinds {','.join(kinds)}")
    runs = soak(seeds, lambda index, run_seed: RealRun(index, run_seed, kinds, work, bed),
                lambda run: check_real(run, ref_out, tolerance), kinds_arg, tmpfs=False, keep=args.keep)
    summary = report(runs, kinds, args.seed, time.monotonic() - began, [], ref.runs, REAL_INVARIANTS)
    return finish(summary, work, args.keep, args.json)


def soak(seeds: list[int], new_run: Callable[[int, int], R], check_run: Callable[[R], None],
         kinds_arg: str, tmpfs: bool, keep: bool) -> list[ChaosRun]:
    """Run, check and print each run in turn."""
    runs: list[ChaosRun] = []
    for index, run_seed in enumerate(seeds):
        run = new_run(index, run_seed)
        runs.append(run)
        t0 = time.monotonic()
        print(f"run {index + 1}/{len(seeds)} seed {run_seed} (replay: python benchmarks/chaos.py{kinds_arg} "
              f"--replay {run_seed}): {'; '.join(i.describe() for i in run.plan)}", flush=True)
        try:
            run.prepare(tmpfs=tmpfs)
            run.run()
            check_run(run)
        finally:
            run.cleanup(keep=bool(run.violations) or keep)
        fired = [i for i in run.plan if i.fired and not i.note]
        print(f"  {len(fired)} injected, {len(run.sups)} supervisor(s), exit {run.sups[-1].rc}, "
              f"{len(run.violations)} violation(s), {time.monotonic() - t0:.0f} s", flush=True)
        for v in run.violations:
            print(f"  VIOLATION invariant {v.invariant} ({v.kind}): {v.detail}", flush=True)
        for inj in run.plan:
            if inj.note:
                print(f"  note: {inj.describe()}: {inj.note}", flush=True)
    return runs


def finish(summary: dict[str, object], work: Path, keep: bool, as_json: bool) -> int:
    print_table(summary)
    if summary["violations"] or keep:
        print(f"work dir kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if as_json:
        print(json.dumps(summary))
    return 0 if summary["violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
