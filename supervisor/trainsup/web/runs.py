"""Owns what the page says about runs: which runs it knows, and each one's row and detail.

The runs are those ``trainsup status`` knows, and the same state judgement (``commands.status``): every
project in the projects directory, every entry of the queue's state directory, the run dirs named on
the command line, and every run of the box's index (``record.runindex``: each supervisor registers its
run dir as it starts, so a ``trainsup run`` started by hand shows at the next refresh). One run dir
is one run however many of these name it. A run's id in the page's URLs is a hash of its run dir (a
project that cannot be loaded: of its file), so a bookmark keeps working while the list changes.
States are worded as ``trainsup status`` and the queue word them (``run.runstate.shown_state``).

The detail comes from the run's files through ``journals`` (incrementally) and ``files``: the curve,
the fault -> remedy -> resume timeline, the samples with their true step, the log tail, and what the
weights were trained with (``trained-with.json``, else the last end record's ``trained_with``).
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
from markupsafe import Markup

from ..commands.runref import RefError, RunRef, every_project, resolve
from ..commands.status import LIVE_STATES, RunView, view
from ..record import journalkinds as kinds
from ..record.runindex import registered
from ..record.textfmt import format_duration, format_size
from ..run import trainedwith
from ..run.runstate import shown_state
from ..service.queuestore import Entry, QueueStore
from . import plots
from .files import SampleFile, file_url, log_tail, sample_files
from .journals import Records, RunRecords

MIB = 1024 * 1024
REGISTERED = "started on this box"  # a run found in the box's index of runs (``record.runindex``) only


@dataclass
class KnownRun:
    id: str
    ref: RunRef
    sources: list[str] = field(default_factory=list)  # "project FILE", "queue q3", "command line"
    entry: Entry | None = None


def run_id(key: Path | str) -> str:
    return hashlib.sha256(str(key).encode()).hexdigest()[:12]


class Catalog:
    """The runs the page knows, found anew on each look (a directory listing, cheap)."""

    def __init__(self, env: Mapping[str, str], store: QueueStore, named: Sequence[Path]) -> None:
        self.env, self.store, self.named = env, store, list(named)
        self.records = Records()

    def runs(self) -> list[KnownRun]:
        found: dict[str, KnownRun] = {}

        def add(ref: RunRef, source: str, entry: Entry | None = None) -> None:
            # one run dir is one run, however it is named (a project's, a queue entry's, typed)
            key = run_id(ref.run_dir.resolve() if ref.run_dir is not None else (ref.project or ref.name))
            known = found.setdefault(key, KnownRun(key, ref))
            known.sources.append(source)
            if entry is not None and (known.entry is None or entry.seq > known.entry.seq):
                known.entry = entry

        for path in self.named:
            try:
                add(resolve(str(path), self.env), "command line")
            except RefError as exc:
                why = str(exc) if path.exists() else f"{path} does not exist (moved away, or never run here)"
                add(RunRef(str(path), None, None, why), "command line")
        _, projects = every_project(self.env)
        for ref in projects:
            add(ref, f"project {ref.project}")
        try:
            entries = self.store.entries() if self.store.exists() else []
        except OSError:
            entries = []
        for entry in entries:
            add(RunRef(entry.project, Path(entry.run_dir), Path(entry.file)), f"queue {entry.id}", entry)
        for registration in registered(self.env):  # every supervisor on the box, read anew each look
            add(RunRef(str(registration.run_dir), registration.run_dir), REGISTERED)
        return list(found.values())

    def get(self, rid: str) -> KnownRun | None:
        return next((r for r in self.runs() if r.id == rid), None)

    def records_of(self, run: KnownRun) -> RunRecords | None:
        return self.records.of(run.ref.run_dir) if run.ref.run_dir is not None else None


@dataclass
class Row:
    """One line of the runs list."""

    run: KnownRun
    view: RunView
    remedy: str | None
    live: bool

    @property
    def step_text(self) -> str:
        v = self.view
        if v.step is None:
            return "–"
        return f"{v.step}/{v.total}" if v.total else str(v.step)

    @property
    def loss_text(self) -> str:
        return "–" if self.view.loss is None else f"{self.view.loss:.4g}"

    @property
    def speed_text(self) -> str:
        rate = self.view.rate
        return f"{rate:.3g} it/s" if self.live and rate else "–"

    @property
    def eta_text(self) -> str:
        return format_duration(self.view.eta_s) if self.view.eta_s is not None else "–"

    @property
    def gpu_text(self) -> str:
        if not self.live or not self.view.gpu:
            return "–"
        parts = []
        for g in self.view.gpu:
            used, total = g.get("used_mib"), g.get("total_mib")
            if isinstance(used, (int, float)):
                shown = format_size(used * MIB) + (f" / {format_size(total * MIB)}"
                                                   if isinstance(total, (int, float)) else "")
                parts.append(f"gpu{g.get('index')} {shown}")
        return ", ".join(parts) or "–"

    @property
    def ranks_text(self) -> str | None:
        """``ranks 0, 1 (pids 4323, 4324)`` while the run trains under a launcher of several ranks."""
        found = sorted((r["rank"], r.get("pid")) for r in self.view.ranks or [] if isinstance(r.get("rank"), int))
        if not self.live or len(found) < 2:
            return None
        return (f"ranks {', '.join(str(r) for r, _ in found)} "
                f"(pids {', '.join(str(pid) for _, pid in found)})")

    @property
    def percent(self) -> float | None:
        v = self.view
        if v.step is None or not v.total:
            return None
        return max(0.0, min(100.0, 100.0 * v.step / v.total))


def row(catalog: Catalog, run: KnownRun) -> Row:
    v = view(run.ref)
    records = catalog.records_of(run)
    remedy = None
    if records is not None:
        with records.lock:
            project = (records.run_start or {}).get("project")
            if ("command line" in run.sources or run.sources == [REGISTERED]) and isinstance(project, str) and project:
                v.name = project  # a run dir typed on the command line says little; the page shows it apart
            for record in reversed(records.decisions):
                if record.get("event") == kinds.REMEDY:
                    remedy = "; ".join(str(a) for a in record.get("actions") or []) or None
                    break
                if record.get("event") == kinds.RUN_START:
                    break
    if v.state == "new" and run.entry is not None and run.entry.state == "queued":
        v.state = "queued"  # never run yet, and waiting in the queue: that is what the user wants to read
    return Row(run, v, remedy, v.state in LIVE_STATES)


# --- one run -------------------------------------------------------------------------------------
@dataclass
class Sample:
    url: str
    name: str
    step: int | None
    attempt: int | None
    when: str


@dataclass
class TimelineItem:
    ts: float
    kind: str
    attempt: int | None
    text: str
    detail: str | None = None

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.ts)) if self.ts else "?"


@dataclass
class Detail:
    row: Row
    loss_chart: Markup | None
    gpu_chart: Markup | None
    timeline: list[TimelineItem]
    samples: list[Sample]
    log: list[tuple[int, str]]
    broken_lines: int
    missing: str | None  # the run dir is gone, or was never made
    trained_with: TrainedWith | None = None  # what trainsup changed in the recipe, as of the run's last end


@dataclass
class TrainedChange:
    change: str
    span: str  # "from step 8", "from step 4 until step 12"
    cls: str
    evidence: str | None


@dataclass
class TrainedWith:
    """``trained-with.json`` (or the end record's ``trained_with``) as the page shows it."""

    changes: list[TrainedChange]
    end: str  # finished | failed | stopped (``run.runstate.shown_state``)
    ts: float | None

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.ts)) if self.ts else "?"


def detail(catalog: Catalog, run: KnownRun) -> Detail:
    r = row(catalog, run)
    run_dir = run.ref.run_dir
    if run_dir is None or not run_dir.is_dir():
        why = run.ref.problem or f"{run_dir} does not exist (never run here, or moved away)"
        return Detail(r, None, None, [], [], [], 0, why)
    records = catalog.records.of(run_dir)
    with records.lock:
        starts = _attempt_starts(records.decisions)
        chart = _drawn(records, "loss", records.version, lambda: _loss_chart(records, starts))
        gpu = _drawn(records, "gpu", records.version, lambda: _gpu_chart(records, starts))
        items = timeline(records.decisions)
        samples = _samples(run, records, starts)
        broken = records.events.broken + records.progress.broken
        ended = next((d for d in reversed(records.decisions) if d.get("event") in kinds.ENDS
                      and isinstance(d.get("trained_with"), list)), None)
    return Detail(r, chart, gpu, items, samples, log_tail(run_dir), broken, None,
                  trained_with(trainedwith.load(run_dir), ended))


def trained_with(written: dict[str, Any] | None, ended: dict[str, Any] | None) -> TrainedWith | None:
    """The newer of ``trained-with.json`` and the last end record's field (the file may be missing, or
    older: a full disk at the end); None before any end of a trainsup that records it."""
    if ended is not None:
        code = ended.get("exit_code")
        end = "finished" if ended.get("event") == kinds.FINISHED else \
            shown_state("stopped", code if isinstance(code, int) else None)
        from_end = {"end": end, "ts": ended.get("ts"), "changes": ended["trained_with"]}
        if written is None or _float(from_end["ts"]) > _float(written.get("ts")):
            written = from_end
    if written is None:
        return None
    changes = []
    for c in written.get("changes") or []:
        if not isinstance(c, dict):
            continue
        given = c.get("why")
        why: dict[str, Any] = given if isinstance(given, dict) else {}
        span = f"from step {c.get('from_step')}" if c.get("from_step") is not None else "from its first attempt"
        if c.get("until_step") is not None:
            span += f" until step {c.get('until_step')} (then a new supervisor started from the recipe as given)"
        evidence = why.get("evidence")
        changes.append(TrainedChange(str(c.get("change")), span, str(why.get("class") or "unknown fault"),
                                     str(evidence) if evidence else None))
    end = str(written.get("end") or "ended")
    return TrainedWith(changes, "failed" if end == "gave_up" else end, _float(written.get("ts")) or None)


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _drawn(records: RunRecords, name: str, key: Any, draw: Callable[[], Markup | None]) -> Markup | None:
    """A chart drawn once for each state of the records: a refresh with nothing new costs nothing."""
    cached = records.drawn.get(name)
    if cached is not None and cached[0] == key:
        return cast(Markup | None, cached[1])
    chart = draw()
    records.drawn[name] = (key, chart)
    return chart


def _attempt_starts(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``attempt_start`` records of the newest supervisor's run, and those before (a run dir
    taken over keeps its attempt numbers going)."""
    return [d for d in decisions if d.get("event") == kinds.ATTEMPT_START and isinstance(d.get("attempt"), int)]


def _loss_chart(records: RunRecords, starts: list[dict[str, Any]]) -> Markup | None:
    """The loss over true steps, an attempt a series. The x axis spans the steps trained so far, as
    TensorBoard's does: early on, a curve drawn against the whole run would be squeezed into its first
    pixels (the progress bar above it says how far the run is)."""
    if not records.steps:
        return None
    attempts = np.asarray(records.attempts)
    steps = np.asarray(records.steps, dtype=np.float64)
    losses = np.asarray(records.losses, dtype=np.float64)
    lo, hi = float(steps.min()), float(steps.max())
    series = [(f"attempt {a}", plots.downsample(steps[attempts == a], losses[attempts == a], lo, hi))
              for a in np.unique(attempts).tolist()]
    marks = [plots.Mark(float(_int(d.get("resume_step")) or 0), f"#{d['attempt']}", "boundary",
                        f"attempt {d['attempt']} resumed at step {_int(d.get('resume_step')) or 0}")
             for d in starts if d["attempt"] > 1 or _int(d.get("resume_step"))]
    faults = {d.get("attempt"): str(d.get("class")) for d in records.decisions if d.get("event") == kinds.FAULT}
    marks += [plots.Mark(float(_int(d.get("step")) or 0), f"{faults[d.get('attempt')]} (attempt {d.get('attempt')})",
                         "fault")
              for d in records.decisions if d.get("event") == kinds.ATTEMPT_END and d.get("attempt") in faults]
    if not any(bins for _, bins in series):
        return None  # steps, but no loss shown yet
    return plots.line_chart(series, marks, "step", "loss", (min([lo, *(m.x for m in marks)]), hi))


def _gpu_chart(records: RunRecords, starts: list[dict[str, Any]]) -> Markup | None:
    if not records.gpu:
        return None
    per_device: dict[str, tuple[list[float], list[float]]] = {}
    for ts, _attempt, devices in records.gpu:
        for g in devices:
            used = g.get("u")
            xs, ys = per_device.setdefault(f"gpu{g.get('i')} used MiB", ([], []))
            xs.append(ts)
            ys.append(float(used) if isinstance(used, (int, float)) else math.nan)
    t0, t1 = records.gpu[0][0], records.gpu[-1][0]
    series = [(name, plots.downsample(xs, ys, t0, t1)) for name, (xs, ys) in sorted(per_device.items())]
    marks = [plots.Mark(float(d.get("ts") or t0), f"#{d['attempt']}", "boundary", f"attempt {d['attempt']} launched")
             for d in starts if d["attempt"] > 1 and t0 <= float(d.get("ts") or 0) <= t1]
    return plots.line_chart(series, marks, "time", "MiB", (t0, t1), x_format="time")


def _samples(run: KnownRun, records: RunRecords, starts: list[dict[str, Any]]) -> list[Sample]:
    spec = (records.run_start or {}).get("samples")
    if not isinstance(spec, dict) or not isinstance(spec.get("dirs"), list):
        return []
    dirs = [Path(d) for d in spec["dirs"] if isinstance(d, str)]
    try:
        pattern = re.compile(spec["step_pattern"]) if isinstance(spec.get("step_pattern"), str) else None
    except re.error:
        pattern = None
    roots = sample_roots(run, records)
    out = []
    for found in sample_files(dirs, pattern):
        url = file_url(run.id, roots, found.path)
        if url is None:
            continue
        attempt, offset = _attempt_at(starts, found.mtime)
        step = _true_step(found, spec.get("absolute_steps") is not False, offset, records, attempt)
        out.append(Sample(url, found.path.name, step, attempt,
                          time.strftime("%H:%M:%S", time.localtime(found.mtime))))
    return out


def sample_roots(run: KnownRun, records: RunRecords | None) -> list[Path]:
    """The folders the page serves files of for ``run``: its run dir, then its sample dirs."""
    roots = [run.ref.run_dir] if run.ref.run_dir is not None else []
    spec = (records.run_start or {}).get("samples") if records is not None else None
    if isinstance(spec, dict) and isinstance(spec.get("dirs"), list):
        roots.extend(Path(d) for d in spec["dirs"] if isinstance(d, str))
    return roots


def _attempt_at(starts: list[dict[str, Any]], ts: float) -> tuple[int | None, int]:
    """The attempt running at ``ts`` and its resume step."""
    current: tuple[int | None, int] = (None, 0)
    for d in starts:
        if float(d.get("ts") or 0) <= ts:
            current = (d["attempt"], _int(d.get("resume_step")) or 0)
    return current


def _true_step(found: SampleFile, absolute: bool, offset: int, records: RunRecords, attempt: int | None) -> int | None:
    if found.label is not None:
        return found.label if absolute else found.label + offset
    # no step in the name: the step the run had reached when the file was written
    best = None
    for a, s, t in zip(records.attempts, records.steps, records.times, strict=True):
        if t <= found.mtime and (attempt is None or a == attempt):
            best = s
    return best


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- the timeline ----------------------------------------------------------------------------------
SHOWN = {
    kinds.RUN_START: "supervisor started",
    kinds.ATTEMPT_START: "launched",
    kinds.ATTEMPT_END: "ended",
    kinds.FAULT: "fault",
    kinds.FAULT_LIVE: "fault seen live",
    kinds.REMEDY: "remedy",
    kinds.REMEDY_SKIPPED: "remedy skipped",
    kinds.ENVIRONMENT_UPGRADE: "environment upgraded",
    kinds.HANG_STACKS: "hang: stacks taken",
    kinds.RESUME_EXACT: "resume",
    kinds.RESUME_INEXACT: "resume (not exact)",
    kinds.DEADLINE: "deadline signal",
    kinds.REQUEUED: "requeued",
    kinds.FINISHED: "finished",
    kinds.GAVE_UP: "gave up",
    kinds.WARNING: "warning",
    kinds.INFO: "note",
    kinds.SUPERVISOR_RESTART: "supervisor restarted",
    kinds.ORPHAN_STOPPED: "orphan stopped",
    kinds.LEASE_TAKEN_OVER: "lease taken over",
    kinds.CHANGE_APPLIED: "edit applied",
    kinds.CHANGE_REJECTED: "edit rejected",
    kinds.CHANGE_SCHEDULED: "edit scheduled",
    kinds.CACHE_INVALIDATED: "cache invalidated",
    kinds.FINAL_PUBLISHED: "final weights published",
    kinds.SEGMENT_RELAUNCH: "relaunched at an epoch's end",
    kinds.PLAN_ADJUSTED: "plan adjusted",
}


def timeline(decisions: list[dict[str, Any]], limit: int = 300) -> list[TimelineItem]:
    """The run's story, newest last: what broke, what trainsup changed, where it resumed."""
    items = []
    for d in decisions:
        kind = d.get("event")
        if kind not in SHOWN:
            continue
        text, detail = _words(str(kind), d)
        ts = d.get("ts")
        items.append(TimelineItem(float(ts) if isinstance(ts, (int, float)) else 0.0, str(kind),
                                  _int(d.get("attempt")), text, detail))
    return items[-limit:]


def _words(kind: str, d: dict[str, Any]) -> tuple[str, str | None]:
    label = SHOWN[kind]
    if kind == kinds.RUN_START:
        return f"{label} ({d.get('trainer') or 'trainer unknown'})", None
    if kind == kinds.ATTEMPT_START:
        where = f"resuming from step {d.get('resume_step')}" if d.get("resume_from") else "from the beginning"
        return f"attempt {d.get('attempt')} {label}, {where}", d.get("resume_from")
    if kind == kinds.ATTEMPT_END:
        planned = {"run_complete": "stopped by trainsup once the last step was saved",
                   "relaunch": "stopped by trainsup to relaunch from a complete state"}.get(str(d.get("planned_stop")))
        how = planned or (f"signal {d.get('signal')}" if d.get("signal") else f"exit {d.get('exit_code')}")
        return f"attempt {d.get('attempt')} {label}: {how}, at step {d.get('step')}", None
    if kind in (kinds.FAULT, kinds.FAULT_LIVE):
        return f"{label}: {d.get('class')}", d.get("evidence")
    if kind in (kinds.REMEDY, kinds.REMEDY_SKIPPED):
        given = d.get("actions") or []  # a list of changes; a skipped rung's description is one string
        actions = given if isinstance(given, str) else "; ".join(str(a) for a in given)
        return f"{label} for {d.get('class')}: {actions or 'restart as it was'}", d.get("reason")
    if kind == kinds.ENVIRONMENT_UPGRADE:
        return f"{label}: {d.get('spec')} (exit {d.get('exit_code')})", d.get("python")
    if kind == kinds.GAVE_UP:  # every end but a finish: failed or stopped, as the status and the queue say
        code, reason = d.get("exit_code"), str(d.get("reason") or "no reason recorded")
        shown = shown_state("stopped", code if isinstance(code, int) else None)
        return (reason if reason.startswith("stopped") else f"{shown}: {reason}"), None
    if kind == kinds.FINISHED:
        return f"{label}: {d.get('reason')}", d.get("final_weights")
    if kind == kinds.SEGMENT_RELAUNCH:  # sd-scripts: a planned stop, so that its saves need no every-step cadence
        return f"{label} (step {d.get('step')})", d.get("why")
    message = d.get("message") or d.get("note") or d.get("reason") or d.get("path")
    return label, str(message) if message else None
