"""The real mode's five invariants, checked after a run ends (`check_real`) against the soak's one bare
reference run: (1) the run finished (journal ends `finished`, status `finished`, exit 0, no
`gave_up`); (2) exactly the steps asked for (last `attempt_start`'s `resume_step` + last
`attempt_end`'s `steps_trained` = 20, no `attempt_end` past 20, status step 20 of 20); (3) the output
dir lists exactly the reference's names; (4) every weights file and every state's model equal the
reference's within the tolerance, every state's `current_step` the reference's; (5) no traceback or
exit 70 of trainsup's, never two trainers on the output dir at once (none left is checked by the
driver). Each violation is recorded on the run with the kind of injection it follows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checks import check_tracebacks, kind_at
from .files import max_abs_diff, read_events
from .params import REAL_STEPS
from .real_bed import visible_names
from .real_driver import RealRun
from .report import steps_redone


def check_real(run: RealRun, ref: Path, tolerance: float) -> None:
    events, bad = read_events(run.run_dir)
    run.events = events
    status = _status(run)
    _check_finished(run, events, bad, status)
    _check_steps(run, events, status)
    _check_names(run, ref)
    _check_weights(run, ref, tolerance)
    check_tracebacks(run, invariant=5)
    _check_overlaps(run)
    run.redone = steps_redone(run)


def _status(run: RealRun) -> dict[str, Any]:
    try:
        data = json.loads((run.run_dir / "status.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _check_finished(run: RealRun, events: list[dict[str, Any]], bad: list[str], status: dict[str, Any]) -> None:
    for line in bad:
        run.violate(1, run.kinds, f"events.jsonl line does not parse: {line!r}")
    for e in events:
        if e.get("event") == "gave_up":
            run.violate(1, kind_at(run, e.get("ts")), f"gave_up: {e.get('reason')} (exit {e.get('exit_code')})")
    if run.timed_out:
        return  # the driver counted it
    last = events[-1] if events else None
    if last is None or last.get("event") != "finished":
        run.violate(1, run.kinds, f"the journal does not end with finished: {json.dumps(last)[:300]}")
    final = run.sups[-1]
    if final.rc != 0:
        run.violate(1, kind_at(run, final.ended), f"the last trainsup (#{final.n}) exited {final.rc}")
    if status.get("state") != "finished":
        run.violate(1, run.kinds, f"status.json says state {status.get('state')!r}")


def _check_steps(run: RealRun, events: list[dict[str, Any]], status: dict[str, Any]) -> None:
    starts = [e for e in events if e.get("event") == "attempt_start"]
    ends = [e for e in events if e.get("event") == "attempt_end"]
    if not starts or not ends:
        run.violate(2, run.kinds, f"{len(starts)} attempt_start and {len(ends)} attempt_end in the journal")
        return
    start, end = starts[-1], ends[-1]
    trained = int(start.get("resume_step") or 0) + int(end.get("steps_trained") or 0)
    if trained != REAL_STEPS or "steps_trained" not in end:
        run.violate(2, run.kinds, f"last attempt resumed at {start.get('resume_step')} and trained "
                                  f"{end.get('steps_trained')} (attempt {end.get('attempt')}): {trained}, not "
                                  f"{REAL_STEPS}")
    for e in ends:
        if int(e.get("step") or 0) > REAL_STEPS:
            run.violate(2, kind_at(run, e.get("ts")), f"attempt {e.get('attempt')} ended at step {e.get('step')}, "
                                                      f"past {REAL_STEPS}")
    if (status.get("step"), status.get("total")) != (REAL_STEPS, REAL_STEPS):
        run.violate(2, run.kinds, f"status.json ends at step {status.get('step')} of {status.get('total')}")


def _check_names(run: RealRun, ref: Path) -> None:
    mine, theirs = set(visible_names(run.out)), set(visible_names(ref))
    if mine != theirs:
        run.violate(3, run.kinds, f"output dir names differ from the reference's: missing {sorted(theirs - mine)}, "
                                  f"extra {sorted(mine - theirs)}")


def _check_weights(run: RealRun, ref: Path, tolerance: float) -> None:
    for name in visible_names(ref):
        if name.endswith(".safetensors"):
            _compare(run, run.out / name, ref / name, name, tolerance)
        elif name.endswith("-state") and (run.out / name).is_dir():
            _compare(run, run.out / name / "model.safetensors", ref / name / "model.safetensors",
                     f"{name}/model.safetensors", tolerance)
            steps = [_current_step(d / name) for d in (run.out, ref)]
            if steps[0] != steps[1]:
                run.violate(4, run.kinds, f"{name}/train_state.json current_step {steps[0]}, the reference's "
                                          f"{steps[1]}")


def _compare(run: RealRun, mine: Path, theirs: Path, rel: str, tolerance: float) -> None:
    if not mine.exists():
        if mine.parent != run.out:  # a missing top-level name is invariant 3's
            run.violate(4, run.kinds, f"{rel} missing")
        return
    try:
        diff = max_abs_diff(mine, theirs)
    except Exception as exc:  # noqa: BLE001 - a file that does not load differs
        run.violate(4, run.kinds, f"{rel} does not load ({type(exc).__name__}: {str(exc)[:120]})")
        return
    if diff > tolerance:
        run.violate(4, run.kinds, f"{rel}: max |dw| {diff:.3g} from the reference's (tolerance {tolerance:g})")


def _current_step(state: Path) -> object:
    try:
        return json.loads((state / "train_state.json").read_text()).get("current_step")
    except (OSError, ValueError, AttributeError) as exc:
        return f"unreadable ({type(exc).__name__})"


def _check_overlaps(run: RealRun) -> None:
    """One violation per pair of trainers seen at once (sampled every 50 ms: many samples a pair)."""
    pairs: dict[tuple[int, ...], list[float]] = {}
    for when, pids in run.watch.overlaps:
        pairs.setdefault(tuple(pids), []).append(when)
    for pair, seen in pairs.items():
        run.violate(5, kind_at(run, seen[0]), f"two train_network.py on the output dir at once: pids "
                                              f"{list(pair)}, {len(seen)} samples over {seen[-1] - seen[0]:.2f} s")
