"""The six invariants, checked after a run ends (`check`): (1) final weights equal to a reference
run's, chained along the final attempt's resume lineage when a caption edit changed what a launch
read; (2) no output file changed or vanished after an injection saw it whole, inputs as the
benchmark wrote them; (3) resumes only from complete, uninterrupted, listed and not-bad states;
(4) no orphan trainer past the bound and never two trainers at once; (5) a journal that parses and
ends `finished`, exit codes matching it; (6) no traceback of trainsup's own. Each violation is
recorded on the run (`ChaosRun.violate`) with the kind of injection it follows."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from .driver import ChaosRun
from .files import digest_dir, has_all_files, max_abs_diff, read_events, read_ledger, sha256, state_problem
from .params import FILLER, ORPHAN_BOUND_S, RESTARTING, SAMPLE_RECORD, TOLERANCE
from .plan import Injection
from .report import steps_redone


def check(run: ChaosRun) -> None:
    events, bad = read_events(run.run_dir)
    run.events = events
    _check_journal(run, events, bad)
    check_tracebacks(run)
    _check_files(run)
    _check_resumes(run, events)
    _check_processes(run, events)
    _check_weights(run, events)
    run.redone = steps_redone(run)


def kind_at(run: ChaosRun, when: float | None) -> str:
    """The kind of the last injection fired before ``when`` (the run's kinds without one)."""
    fired = [inj for inj in run.plan if inj.fired is not None and (when is None or inj.fired <= when)]
    return fired[-1].kind if fired else run.kinds


def _check_journal(run: ChaosRun, events: list[dict[str, Any]], bad: list[str]) -> None:
    for line in bad:
        run.violate(5, run.kinds, f"events.jsonl line does not parse: {line!r}")
    disk_fulls = sum(1 for inj in run.plan if inj.kind == "disk_full" and inj.fired and not inj.note)
    reported = None
    for e in events:
        if e.get("event") == "gave_up":
            reason = str(e.get("reason"))
            if reason.startswith("disk_full") and e.get("exit_code") == 4 and disk_fulls:
                disk_fulls -= 1  # ours: the benchmark gives the space back and starts it again
                continue
            reported = e
            run.violate(5, kind_at(run, e.get("ts")), f"gave_up: {reason} (exit {e.get('exit_code')})")
    last = events[-1] if events else None
    if not run.timed_out and (last is None or last.get("event") != "finished") and last is not reported:
        run.violate(5, run.kinds, f"the journal does not end with finished: {json.dumps(last)[:300]}")
    ends = [e for e in events if e.get("event") in ("finished", "gave_up")]
    for sup in run.sups:
        if sup.killed is not None or run.timed_out:
            continue
        mine = [e for e in ends if sup.started <= e.get("ts", 0) <= (sup.ended or time.time()) + 1]
        want = None if not mine else 0 if mine[-1]["event"] == "finished" else mine[-1].get("exit_code")
        if sup.rc != want:
            said = sup.err.read_text(errors="replace").strip().splitlines()[-1:] if sup.err.exists() else []
            run.violate(5, kind_at(run, sup.ended), f"trainsup #{sup.n} exited {sup.rc}; its journaled "
                                                     f"end says {want}; its last line: {said[0] if said else None!r}")


def check_tracebacks(run: ChaosRun, invariant: int = 6) -> None:
    """No traceback in any supervisor's stderr and no internal-error exit 70."""
    for sup in run.sups:
        text = sup.err.read_text(errors="replace")
        if "Traceback (most recent call last)" in text or sup.rc == 70:
            at = text.find("Traceback")
            run.violate(invariant, kind_at(run, sup.ended), f"trainsup #{sup.n} (exit {sup.rc}) printed: "
                                                             f"{text[max(at, 0):][:600]!r}")


def _kept_after_move(path: Path, digest: str, events: list[dict[str, Any]]) -> bool:
    """Whether a file trainsup moved (journal ``save_hidden``, ``state_set_aside``; a sample of an
    attempt's own name, ``sample_hidden``, after publishing it under its true name) is whole where it
    went, or was one of its own saves it pruned later (``save_pruned``)."""
    for e in events:
        if e.get("event") == "sample_hidden" and Path(e["file"]) == path:
            moved = Path(e["to"])
            return moved.is_file() and sha256(moved) == digest
        if e.get("event") not in ("save_hidden", "state_set_aside"):
            continue
        src, dst = Path(e["dir"]), Path(e["to"])
        if path == src or path.is_relative_to(src):
            moved = dst / path.relative_to(src) if path != src else dst
            if moved.is_file():
                return sha256(moved) == digest
            # a pruned state takes its weights file (same name without "-state") with it
            pruned = {Path(p["dir"]) for p in events if p.get("event") == "save_pruned"}
            state_of_weights = dst.with_name(f"{dst.stem}-state")
            return e["event"] == "save_hidden" and any(d in (dst, state_of_weights) or dst.is_relative_to(d)
                                                      for d in pruned)
    return False


def _check_files(run: ChaosRun) -> None:
    now = digest_dir(run.out, (".trainsup", FILLER))
    events, _ = read_events(run.run_dir)
    published = {str(Path(e["dst"]).relative_to(run.out)) for e in events
                 if e.get("event") == "final_published" and str(e.get("dst", "")).startswith(str(run.out))}
    reported = set(published)  # one violation a file, at the first injection that saw it whole
    for inj in run.plan:
        if inj.fired is None:
            continue
        for rel, digest in inj.snapshot.items():
            if now.get(rel) == digest or rel in inj.in_progress or rel in reported:
                continue
            if _kept_after_move(run.out / rel, digest, events):
                continue  # trainsup moved its own save out of sight, or set an incomplete one aside
            if rel == SAMPLE_RECORD and rel in now:
                continue  # the demo appends a record per sample: checked as a prefix below
            what = "vanished" if rel not in now else "changed"
            reported.add(rel)
            run.violate(2, inj.kind, f"{rel} {what} after {inj.describe()}")
        used = run.out / SAMPLE_RECORD
        if inj.sample_record and not (used.is_file() and used.read_bytes().startswith(inj.sample_record)):
            run.violate(2, inj.kind, f"{SAMPLE_RECORD} lost records written before {inj.describe()}")
    expected = dict(run.inputs_before)
    for _, path, text in run.edits:
        rel = "prompts.txt" if path == run.prompts else str(path.relative_to(run.dataset))
        expected[rel] = hashlib.sha256(text.encode()).hexdigest()
    inputs_now = {**digest_dir(run.dataset), "prompts.txt": sha256(run.prompts)}
    for rel in sorted(set(expected) | set(inputs_now)):
        if expected.get(rel) != inputs_now.get(rel):
            run.violate(2, kind_at(run, None), f"input {rel} differs from what the benchmark wrote")
    if sha256(run.assets["model"]) != run.model_digest:
        run.violate(2, run.kinds, "the base model changed")


def _check_resumes(run: ChaosRun, events: list[dict[str, Any]]) -> None:
    ledger = read_ledger(run.run_dir)
    listed = {s["dir"] for s in ledger.get("states", [])}
    bad = set(ledger.get("bad_states", []))
    interrupted: dict[str, Injection] = {}
    for inj in run.plan:
        if inj.fired is not None and inj.kind in RESTARTING:
            for d in inj.incomplete:
                if not has_all_files(Path(d)):
                    interrupted[d] = inj
    for e in events:
        src = e.get("resume_from") if e.get("event") == "attempt_start" else None
        if not src:
            continue
        kind = kind_at(run, e.get("ts"))
        if src in interrupted:
            run.violate(3, kind, f"attempt {e['attempt']} resumed from {Path(src).name}, whose save "
                                  f"{interrupted[src].describe()} interrupted")
        elif src not in listed or src in bad:
            run.violate(3, kind, f"attempt {e['attempt']} resumed from {Path(src).name}, which the ledger "
                                  f"{'marks bad' if src in bad else 'does not list'}")
        problem = state_problem(Path(src))
        if problem:
            run.violate(3, kind, f"attempt {e['attempt']} resumed from {Path(src).name}: {problem}")


def _check_processes(run: ChaosRun, events: list[dict[str, Any]]) -> None:
    for when, pids in run.watch.overlaps:
        run.violate(4, kind_at(run, when), f"two trainers at once on the output dir: pids {pids}")
    stopped = {pid: e for e in events if e.get("event") == "orphan_stopped" for pid in e.get("pids", [])}
    mtimes = [p.stat().st_mtime for p in run.out.rglob("*")
              if p.is_file() and p.relative_to(run.out).parts[0] not in (".trainsup", FILLER)]
    for sup in run.sups:
        if sup.killed is None:
            continue
        for pid in sup.trainers:
            seen = run.watch.seen.get(pid)
            if seen is None:
                continue  # gone before the table saw it
            died = seen.gone if seen.gone is not None else time.time()
            lived = died - sup.killed
            if lived <= ORPHAN_BOUND_S:
                continue
            later = [e for e in events if e.get("event") == "attempt_start" and e["ts"] > sup.killed]
            wrote = [m for m in mtimes if sup.killed + ORPHAN_BOUND_S < m < died]
            stopped_late = pid in stopped and (not later or died > later[0]["ts"] + 0.1)
            # docs/guides/robustness.md: a trainer that prints nothing (here: still loading, no bar yet) lives on until
            # the next supervisor stops it, or until its first line meets the closed pipe.
            if sup.loading and not wrote and not stopped_late:
                continue
            why = ("it was training when its supervisor died" if not sup.loading else
                   "it wrote files after the bound" if wrote else "it was still alive at the next launch")
            run.violate(4, "kill_supervisor", f"trainer pid {pid} outlived its killed supervisor by "
                                               f"{lived:.1f} s ({why})")


def _check_weights(run: ChaosRun, events: list[dict[str, Any]]) -> None:
    if run.timed_out or not events or events[-1].get("event") != "finished" or run.sups[-1].rc != 0 \
            or run.refs is None:
        return
    final = run.out / "lora.safetensors"
    if not final.is_file():
        run.violate(1, run.kinds, "finished without final weights at the command's path")
        return
    schedule = _schedule(run, events)
    if schedule is None:
        run.violate(1, run.kinds, "cannot trace the final attempt's resume lineage through the ledger")
        return
    diff = max_abs_diff(final, run.refs.weights(schedule))
    if diff > TOLERANCE:
        segs = ", ".join(f"from {s} with {d.name}" for s, d in schedule)
        run.violate(1, run.kinds, f"final weights differ from the reference ({segs}): max abs diff {diff:.3g}")


def _schedule(run: ChaosRun, events: list[dict[str, Any]]) -> list[tuple[int, Path]] | None:
    """(start step, dataset dir) per segment of the final attempt's lineage, equal captions merged."""
    starts = {e["attempt"]: e for e in events if e.get("event") == "attempt_start"}
    by_dir = {s["dir"]: s["attempt"] for s in read_ledger(run.run_dir).get("states", [])}
    attempt = max(starts)
    lineage = []
    while True:
        start = starts.get(attempt)
        if start is None:
            return None
        lineage.append(start)
        src = start.get("resume_from")
        if not src:
            break
        if src not in by_dir:
            return None
        attempt = by_dir[src]
    schedule: list[tuple[int, Path]] = []
    for start in reversed(lineage):
        # the demo reads its captions at launch: the edits made before this attempt started
        caption_edits = [(t, p, s) for t, p, s in run.edits if p != run.prompts and t < start["ts"]]
        dataset = _dataset_version(run, caption_edits)
        if not schedule or schedule[-1][1] != dataset:
            schedule.append((int(start.get("resume_step") or 0), dataset))
    return schedule


def _dataset_version(run: ChaosRun, edits: list[tuple[float, Path, str]]) -> Path:
    if not edits:
        return run.assets["dataset"]
    version = run.dir / f"dataset-v{len(edits)}"
    if not version.exists():
        shutil.copytree(run.assets["dataset"], version)
        for _, path, text in edits:
            (version / path.relative_to(run.dataset)).write_text(text, encoding="utf-8")
    return version
