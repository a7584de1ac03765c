"""Reporting: the figures of a checked run (`steps_redone`: steps trained again after each restarting
fault, and steps since the newest complete state), the soak's summary (`report`, the object `--json`
prints) and its table (`print_table`); the invariants' names are the mode's (demo or real)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .files import read_ledger
from .params import INVARIANTS, RESTARTING

if TYPE_CHECKING:
    from .driver import ChaosRun


def steps_redone(run: ChaosRun) -> list[tuple[str, int, int]]:
    """(kind, steps trained again, steps since the newest complete state) per restarting fault."""
    events = run.events
    steps = {s["dir"]: s["step"] for s in read_ledger(run.run_dir).get("states", [])}
    found = []
    for inj in run.plan:
        if inj.fired is None or inj.kind not in RESTARTING or inj.note or inj.step is None:
            continue
        later = [e for e in events if e.get("event") == "attempt_start" and e["ts"] > inj.fired]
        if not later:
            continue
        newest = max([steps[d] for d in inj.complete if d in steps] + [0])
        # an orphan may save past the step it was at when its supervisor died: nothing redone then
        redone = max(inj.step - int(later[0].get("resume_step") or 0), 0)
        found.append((inj.kind, redone, inj.step - newest))
    return found


def report(runs: list[ChaosRun], kinds: tuple[str, ...], seed: int, total_s: float, skipped: list[str],
           refs: int, invariants: dict[int, str] = INVARIANTS) -> dict[str, Any]:
    rows: dict[str, dict[str, int]] = {}
    for kind in kinds:
        rows[kind] = {"runs": sum(1 for r in runs if any(i.kind == kind for i in r.plan)),
                      "injections": sum(1 for r in runs for i in r.plan if i.kind == kind and i.fired and not i.note),
                      "violations": 0, "steps_redone": 0, "steps_since_state": 0, "restarts": 0}
    several = 0
    for r in runs:
        for v in r.violations:
            if v.kind in rows:
                rows[v.kind]["violations"] += 1
            else:
                several += 1
        for kind, redone, since in r.redone:
            rows[kind]["steps_redone"] += redone
            rows[kind]["steps_since_state"] += since
            rows[kind]["restarts"] += 1
    violations = [v for r in runs for v in r.violations]
    by_invariant = {str(n): sum(1 for v in violations if v.invariant == n) for n in invariants}
    return {"seed": seed, "runs": len(runs), "injections": sum(row["injections"] for row in rows.values()),
            "violations": len(violations), "kinds": rows, "violations_several_kinds": several,
            "violations_by_invariant": by_invariant,
            "invariant_names": {str(n): name for n, name in invariants.items()},
            "skipped_kinds": skipped, "reference_runs": refs,
            "total_s": round(total_s, 1), "run_seeds": [r.seed for r in runs],
            "violation_list": [v.__dict__ for v in violations]}


def print_table(summary: dict[str, Any]) -> None:
    print(f"\n{'fault kind':<16} {'runs':>5} {'injections':>11} {'violations':>11}  steps redone / since newest state")
    for kind, row in summary["kinds"].items():
        redo = (f"{row['steps_redone']} / {row['steps_since_state']} over {row['restarts']} restarts"
                if row["restarts"] else "-")
        print(f"{kind:<16} {row['runs']:>5} {row['injections']:>11} {row['violations']:>11}  {redo}")
    if summary["violations_several_kinds"]:
        print(f"{'(several kinds)':<16} {'':>5} {'':>11} {summary['violations_several_kinds']:>11}")
    print(f"{'total':<16} {summary['runs']:>5} {summary['injections']:>11} {summary['violations']:>11}")
    print("violations by invariant: " + ", ".join(
        f"{n} {summary['invariant_names'][n]}: {c}" for n, c in summary["violations_by_invariant"].items()))
    for v in summary["violation_list"]:
        print(f"  VIOLATION seed {v['seed']} invariant {v['invariant']} ({v['kind']}): {v['detail']}")
    minutes, seconds = divmod(summary["total_s"], 60)
    print(f"total time {int(minutes)} min {seconds:.0f} s ({summary['reference_runs']} reference runs)")
