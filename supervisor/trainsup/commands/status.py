"""Owns ``trainsup status``: one line (or one JSON object) per run saying where it stands.

The state is ``status.json``'s, judged against the run dir's lock, which only a live supervisor
holds (the kernel drops it however the supervisor dies):

- a live state (``starting``, ``running``, ``stopping``, ``remedying``, ``backoff``) under a free
  lock is ``lost``: the supervisor died without writing its end (SIGKILL, a reboot, an OOM kill);
- a held lock whose snapshot was written before that supervisor took the lock, or that holds no
  state yet, is ``starting``: a new ``trainsup run`` has not written its first state yet (what the file
  says is an older run's);
- an ended run is ``finished``, ``failed`` or ``stopped`` (``run.runstate.shown_state``: the words of
  the page and the queue too; ``status.json`` keeps the supervisor's ``gave_up`` and exit code);
- on shared storage, a live lease of a supervisor on another host (``record.lease``) stands for the
  lock, which that host's ``flock`` may not show here: the run is not ``lost``, and ``host`` names
  the owner (shown in the line as ``pid N on HOST``, since that pid is not this host's);
- no ``status.json`` and nothing else in the run dir (or no run dir at all) is ``new``: never run;
- a ``status.json`` that cannot be read or parsed, a project file that cannot be loaded, or a run
  dir with a journal but no snapshot is ``unknown``, with a ``reason``.

With no argument: every project, every run of the box's index that no project names
(``record.runindex``: each supervisor registers its run dir, so a ``trainsup run`` started by hand is
listed at once; those written to in the last week), then the queue.

The ETA is ``(total - step) / rate`` while ``running`` at a known rate. GPU memory is shown only for
a live run: after the end, ``status.json`` keeps the last sample, which is history (``--json`` gives
it as written).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from ..record.lease import OTHER_HOST, local_identity, origin, read_lease
from ..record.runindex import RECENT_S, registered
from ..record.runlock import Holder, holder
from ..record.textfmt import eta_seconds, progress_parts, shown_path
from ..run.runstate import shown_state
from .runref import RefError, RunRef, attempt_logs, every_project, read_status, resolve

__all__ = ["RunView", "format_line", "registered_refs", "run_status", "view"]

LIVE_STATES = frozenset({"starting", "running", "stopping", "remedying", "backoff"})
EXIT_OK = 0
EXIT_USAGE = 2
MIB_PER_GIB = 1024


@dataclass
class RunView:
    name: str
    state: str
    run_dir: str | None
    attempt: int | None = None
    step: int | None = None
    total: int | None = None
    loss: float | None = None
    rate: float | None = None  # iterations per second
    eta_s: float | None = None
    last_fault: str | None = None
    last_fault_evidence: str | None = None  # its line (the first row of it)
    gpu: list[dict[str, Any]] | None = None
    ranks: list[dict[str, Any]] | None = None  # the processes that train under a launcher: rank and pid each
    pid: int | None = None  # the live supervisor's
    exit_code: int | None = None
    reason: str | None = None
    updated: float | None = None  # unix time of the snapshot
    project: str | None = None  # the project file
    host: str | None = None  # the live supervisor's host, when it is another host


def view(ref: RunRef) -> RunView:
    """Where the run ``ref`` names stands now."""
    project = str(ref.project) if ref.project else None
    if ref.run_dir is None:
        return RunView(ref.name, "unknown", None, reason=ref.problem, project=project)
    run_dir = ref.run_dir
    out = RunView(ref.name, "unknown", str(run_dir), project=project)
    lock = _owner(run_dir, out)
    if lock is not None and lock.pid > 0:
        out.pid = lock.pid
    data, problem = read_status(run_dir)
    if problem is not None:
        out.reason = problem
        return out
    if data is None:
        if lock is not None:
            out.state = "starting"
        elif (run_dir / "events.jsonl").exists() or attempt_logs(run_dir):
            out.reason = f"{run_dir} has a journal but no status.json"
        else:
            out.state = "new"
        return out
    state = data.get("state")
    updated = _number(data.get("updated"))
    if lock is not None and lock.started > 0 and (updated is None or updated < lock.started):
        out.state = "starting"  # the snapshot is an earlier run's: this supervisor has not written yet
        return out
    if not isinstance(state, str) or not state:
        if lock is not None:
            out.state = "starting"  # a live supervisor that has not written its first state yet
            return out
        out.reason = f"{run_dir / 'status.json'} has no state"
        return out
    out.exit_code = _int(data.get("exit_code"))
    out.state = shown_state(state, out.exit_code)  # the words of the page and the queue
    out.attempt, out.step, out.total = _int(data.get("attempt")), _int(data.get("step")), _int(data.get("total"))
    out.loss, out.rate, out.updated = _number(data.get("loss")), _number(data.get("rate")), updated
    out.last_fault = data.get("last_fault") if isinstance(data.get("last_fault"), str) else None
    evidence = data.get("last_fault_evidence")
    out.last_fault_evidence = evidence.split("\n")[0].strip() if isinstance(evidence, str) and evidence else None
    out.reason = data.get("reason") if isinstance(data.get("reason"), str) else None
    gpus = data.get("gpu")
    out.gpu = [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else None
    ranks = data.get("ranks")
    out.ranks = [r for r in ranks if isinstance(r, dict)] if isinstance(ranks, list) else None
    if state in LIVE_STATES and lock is None:
        out.state = "lost"
        out.reason = (f"status.json says {state!r} but no supervisor holds {run_dir / 'lock'}: "
                      "it died without recording an end (its trainer may still be running)")
    elif state == "running":
        out.eta_s = eta_seconds(out.step, out.total, out.rate)
    return out


def _owner(run_dir: Path, out: RunView) -> Holder | None:
    """The live supervisor: the lock's holder, else another host's live lease (sets ``out.host``)."""
    me = local_identity()
    lock = holder(run_dir)
    if lock is not None:
        if origin({"host": lock.host, "boot_id": lock.boot_id}, me) == OTHER_HOST:
            out.host = lock.host
        return lock
    lease = read_lease(run_dir)
    if lease is None or not lease.live(time.time()) or \
            origin({"host": lease.host, "boot_id": lease.boot_id}, me) != OTHER_HOST:
        return None
    out.host = lease.host
    return Holder(lease.pid, 0.0, lease.host, lease.boot_id)


def _gpu_text(entry: Mapping[str, Any]) -> str | None:
    index, used, total = entry.get("index"), _number(entry.get("used_mib")), _number(entry.get("total_mib"))
    if index is None or (used is None and total is None):
        return None
    shown = "/".join("?" if v is None else f"{v / MIB_PER_GIB:.1f}" for v in (used, total))
    return f"gpu{index} {shown} GiB"


def _clip(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def format_line(run: RunView, name_width: int = 0) -> str:
    """One run as a line: name, state, then what is known, a ``(reason)`` last."""
    parts = [run.name.ljust(name_width), run.state.ljust(9)]
    if run.attempt is not None:
        parts.append(f"attempt {run.attempt}")
    live = run.state in LIVE_STATES
    parts.extend(progress_parts(run.step, run.total, run.loss, run.rate if live else None, eta_s=run.eta_s))
    if run.last_fault:
        # An unknown fault says nothing by its class: its line does.
        shown = run.last_fault_evidence if run.last_fault == "unknown" else None
        parts.append(f"fault {run.last_fault}" + (f" ({_clip(shown)})" if shown else ""))
    if live:
        parts.extend(text for text in map(_gpu_text, run.gpu or []) if text)
        numbered = sorted(r["rank"] for r in run.ranks or [] if isinstance(r.get("rank"), int))
        if len(numbered) > 1:
            parts.append(f"{len(numbered)} ranks")
        if run.pid is not None:
            parts.append(f"pid {run.pid}" + (f" on {run.host}" if run.host else ""))
    elif run.exit_code is not None:
        parts.append(f"exit {run.exit_code}")
    if run.reason and run.state != "finished":  # a finished run's reason says only that
        parts.append(f"({run.reason})")
    return "  ".join(parts).rstrip()


def run_status(args: Sequence[str], *, as_json: bool, env: Mapping[str, str], out: TextIO, err: TextIO,
               state: Path | None = None) -> int:
    """Print every named run (every project, and the queue, when none is named); 2 when an argument
    names none."""
    from ..service.queuestore import QueueStore, state_dir
    from .queue import find_entry, queue_text

    store = QueueStore(state_dir(state, env))
    entries = store.entries() if not args and store.exists() else []
    if args:
        refs = []
        for arg in args:
            try:
                refs.append(resolve(arg, env))
            except RefError as exc:
                found = find_entry(arg, env, state)
                if found is None:
                    print(f"trainsup status: error: {exc}", file=err)
                    return EXIT_USAGE
                refs.append(RunRef(f"{found[1].id} {found[1].project}", Path(found[1].run_dir), None))
    else:
        folder, refs = every_project(env)
        refs += registered_refs(refs, entries, env)
        if not refs and not entries and not as_json:
            print(f"trainsup status: no runs started here in the last {RECENT_S / 86400:.0f} days, no projects in "
                  f"{folder} and no queue in {store.root}; name a run dir or a project file", file=err)
    views = [view(ref) for ref in refs]
    if as_json:
        print(json.dumps([asdict(v) for v in views], default=_json_default), file=out)
    else:
        width = max((len(v.name) for v in views), default=0)
        for v in views:
            print(format_line(v, width), file=out)
        if entries:
            print(queue_text(store, entries), file=out)
    return EXIT_OK


def registered_refs(known: Sequence[RunRef], entries: Sequence[Any], env: Mapping[str, str]) -> list[RunRef]:
    """The runs of the box's index (``record.runindex``: every supervisor registers its run dir) that
    no project of ``known`` and no queue entry of ``entries`` names already, newest first."""
    seen = {ref.run_dir.resolve() for ref in known if ref.run_dir is not None}
    seen |= {Path(e.run_dir).resolve() for e in entries}
    return [RunRef(shown_path(r.run_dir), r.run_dir) for r in registered(env) if r.run_dir not in seen]


def _json_default(value: object) -> object:
    return str(value) if isinstance(value, Path) else repr(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
