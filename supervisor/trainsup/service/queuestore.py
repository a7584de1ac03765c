"""Owns the queue's files: the state directory, one file per entry, and every edit of them.

The queue is plain files so that it outlives the daemon and can be read without it::

    STATE/queue/ID/entry.json    the entry (written atomically; a half-written file never exists)
    STATE/queue/ID/NAME.yaml     the project file as it was when queued (a later edit of the
                                 original does not change the queued run)
    STATE/queue/ID/serve.log     what that entry's supervisor printed
    STATE/paused                 present: start nothing new
    STATE/inbox/                 project files dropped here are queued (see ``inbox``)

Every read-modify-write happens under ``STATE/queue.lock`` (``flock``), taken briefly, so the
command line and the daemon never lose each other's edits. Ids are ``q1``, ``q2``, ... in order of
arrival, never reused: ``STATE/queue.seq`` keeps the last number given (a queue dir without it, from
an older trainsup, goes on from its highest id). The queue order is priority (higher first), then
position (arrival, or where ``move`` put the entry).

One project is in the queue once: ``add`` refuses a project while an entry of it is queued or
running, the same project being the same file (resolved path; for an inbox drop, the same name in
the inbox) or the same run dir (two entries on one run dir would take each other's run over). A
name alone is not a project: two ``lora.yaml`` in two folders are two projects.

The state directory is ``--state``, else ``$TRAINSUP_STATE``, else ``/var/lib/trainsup`` for root and
``$XDG_STATE_HOME/trainsup`` (``~/.local/state/trainsup``) for anyone else.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from ..record.fsutil import atomic_write_text
from ..record.runindex import state_root
from ..record.textfile import NotTextError, read_text
from ..run.project import ProjectError, parse_project

STATES = ("queued", "running", "finished", "failed", "stopped")  # the ended ones as ``run.runstate.shown_state``
ENDED = frozenset({"finished", "failed", "stopped"})
ACTIVE = frozenset({"queued", "running"})
_ID = re.compile(r"q([0-9]+)")


class QueueError(ValueError):
    """A queue edit that cannot be done (no such entry, bad project file, ...); the message says why."""


class DuplicateEntry(QueueError):
    """The project is already queued or running (its entry's id and state in the message)."""


def state_dir(given: Path | None, env: Mapping[str, str] = os.environ) -> Path:
    if given is not None:
        return given.expanduser().absolute()
    return state_root(env)  # the same default as the runs index beside it (``record.runindex``)


@dataclass
class Entry:
    id: str
    seq: int  # arrival number: q7 has seq 7
    project: str
    file: str  # the entry's own copy of the project file
    source: str  # where it was queued from
    run_dir: str
    priority: int = 0
    position: float = 0.0  # within one priority; arrival order until a `move`
    gpus: list[str] | None = None  # named by `queue add --gpus` or the project's `gpus:`
    state: str = "queued"
    exit_code: int | None = None
    reason: str | None = None
    added: float = 0.0
    started: float | None = None
    ended: float | None = None
    pid: int | None = None  # the entry's supervisor while it runs
    pid_started: float | None = None  # that process's create time: a reused pid is not ours
    assigned_gpus: list[str] | None = None
    launches: int = 0  # how many supervisors were started for it (a dead one's run is resumed)
    stop_requested: bool = False
    retry_of: str | None = None  # ``queue retry``: the ended entry this one runs again
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        return Path(self.file).parent

    @property
    def log(self) -> Path:
        return self.dir / "serve.log"

    def public(self, position: int | None) -> dict[str, Any]:
        """What ``queue list --json`` shows."""
        data = asdict(self)
        data.pop("extra")
        data["position"] = position
        return data


_FIELDS = {f.name for f in fields(Entry)}


def _entry_from(data: Mapping[str, Any]) -> Entry:
    known = {k: v for k, v in data.items() if k in _FIELDS}
    return Entry(**known)


class QueueStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.queue_dir = root / "queue"
        self.inbox = root / "inbox"
        self.paused_flag = root / "paused"
        self.seq_file = root / "queue.seq"  # the last entry number given: ids are never reused
        self.socket_path = root / "serve.sock"

    def exists(self) -> bool:
        return self.queue_dir.is_dir()

    def ensure(self) -> None:
        """Create the state directory (owner only: it holds the control socket and project copies)."""
        for d in (self.root, self.queue_dir, self.inbox):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self.ensure()
        with open(self.root / "queue.lock", "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # --- reading ---------------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every entry, in queue order (ended ones too, by arrival)."""
        found = []
        try:
            dirs = list(self.queue_dir.iterdir())
        except OSError:
            return []
        for d in dirs:
            entry = self._read(d / "entry.json")
            if entry is not None:
                found.append(entry)
        return sorted(found, key=order_key)

    def get(self, entry_id: str) -> Entry:
        entry = self._read(self.queue_dir / entry_id / "entry.json") if _plain(entry_id) else None
        if entry is None:
            raise QueueError(f"no queue entry {entry_id!r} in {self.queue_dir}")
        return entry

    def find(self, entry_id: str) -> Entry | None:
        try:
            return self.get(entry_id)
        except QueueError:
            return None

    @staticmethod
    def _read(path: Path) -> Entry | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return _entry_from(data) if isinstance(data, dict) else None
        except (OSError, ValueError, TypeError):
            return None  # not an entry (yet): being created, or not ours

    def paused(self) -> bool:
        return self.paused_flag.exists()

    # --- writing (callers hold ``locked()``) -----------------------------------------------------
    def save(self, entry: Entry) -> None:
        atomic_write_text(self.queue_dir / entry.id / "entry.json", json.dumps(asdict(entry), indent=2) + "\n")

    def update(self, entry_id: str, **changes: Any) -> Entry:
        """Re-read the entry and change it (under the lock): the other side's edits are kept."""
        entry = replace(self.get(entry_id), **changes)
        self.save(entry)
        return entry

    def add(self, project_file: Path, gpus: list[str] | None = None, priority: int = 0,
            clock: Any = time.time) -> Entry:
        """Queue a copy of ``project_file``; raises ``QueueError`` naming what is wrong with it
        (``DuplicateEntry`` when the project is already queued or running)."""
        try:
            text = read_text(project_file, "project file")  # read once: the text checked is the text queued
        except OSError as exc:
            raise QueueError(f"{project_file}: cannot read the project file ({exc.strerror or exc})") from None
        except NotTextError as exc:
            raise QueueError(str(exc)) from None
        try:
            project = parse_project(text, project_file)
        except ProjectError as exc:
            raise QueueError(str(exc)) from None
        # The copy lives elsewhere: relative paths in it would resolve against the wrong directory,
        # so the copy names its working directory absolutely (and the run dir, which is relative to it).
        data = yaml.safe_load(text) or {}
        data["cwd"] = str(project.cwd)
        data["run_dir"] = str(project.resolved_run_dir(exact=True))
        if gpus is not None:
            data["gpus"] = list(gpus)  # `queue add --gpus` wins over the file's own
        named = gpus if gpus is not None else _project_gpus(project.env)
        source = str(project_file.resolve())
        with self.locked():
            entries = self.entries()
            _refuse_duplicate(project_file, source, data["run_dir"], entries)
            seq = 1 + max([self._last_seq(), *(e.seq for e in entries)])
            self._note_seq(seq)  # first: an id handed out is spent, whatever happens next
            entry_id = f"q{seq}"
            folder = self.queue_dir / entry_id
            folder.mkdir(mode=0o700)
            copy = folder / f"{project.name}.yaml"
            atomic_write_text(copy, f"# queued from {source} as {entry_id}\n"
                              + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
            entry = Entry(entry_id, seq, project.name, str(copy), source,
                          data["run_dir"], priority, float(seq), named, added=round(clock(), 3))
            self.save(entry)
        return entry

    def _last_seq(self) -> int:
        """The highest entry number ever given: the counter, or any ``qN`` folder (an older queue's,
        or one an interrupted add left without its entry)."""
        try:
            folders = [int(m.group(1)) for d in self.queue_dir.iterdir() if (m := _ID.fullmatch(d.name))]
        except OSError:
            folders = []
        return max([self._counted(), *folders])

    def _counted(self) -> int:
        try:
            return int(self.seq_file.read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            return 0  # none yet (a new queue, or one from before the counter), or unreadable

    def _note_seq(self, seq: int) -> None:
        if seq > self._counted():
            atomic_write_text(self.seq_file, f"{seq}\n")

    def retry_source(self, entry_id: str) -> tuple[Entry, Path]:
        """The ended entry to run again and the project file to queue for it: the file it was queued
        from as it is now (fixed since, as a rule), else the entry's own copy when that file is gone."""
        entry = self.get(entry_id)
        if entry.state not in ("failed", "stopped"):
            then = {"finished": "it finished: its weights are there", "queued": "it is queued already",
                    "running": "it is running"}.get(entry.state, f"it is {entry.state}")
            raise QueueError(f"{entry_id}: only a failed or stopped entry is retried; {then}")
        source = Path(entry.source)
        return entry, source if source.is_file() else Path(entry.file)

    def retry(self, entry_id: str, clock: Any = time.time) -> Entry:
        """Queue a failed or stopped entry again as a new entry (ids are never reused, and the ended
        entry stays as the record of what happened), with its GPUs and priority. Its run dir is the
        same, so the new run resumes from the last state the old one saved."""
        old, path = self.retry_source(entry_id)
        entry = self.add(path, old.gpus, old.priority, clock)
        with self.locked():
            return self.update(entry.id, retry_of=old.id)

    def remove(self, entry_id: str) -> Entry:
        """Take a waiting or ended entry off the queue (its run dir and weights stay where they are)."""
        with self.locked():
            entry = self.get(entry_id)
            if entry.state == "running":
                raise QueueError(f"{entry_id} is running; stop it first (trainsup stop {entry_id})")
            self._note_seq(entry.seq)  # a queue from before the counter: its ids stay spent too
            folder = self.queue_dir / entry.id
            for item in folder.iterdir():
                item.unlink()
            folder.rmdir()
        return entry

    def move(self, entry_id: str, to: int) -> list[Entry]:
        """Put a queued entry at 1-based position ``to`` among the queued entries. It takes the
        priority of the entry it lands before (or after, at the end), so the order holds."""
        with self.locked():
            waiting = [e for e in self.entries() if e.state == "queued"]
            entry = next((e for e in waiting if e.id == entry_id), None)
            if entry is None:
                state = self.get(entry_id).state  # raises when there is no such entry
                raise QueueError(f"{entry_id} is {state}; only queued entries move")
            if not 1 <= to <= len(waiting):
                raise QueueError(f"--to {to}: expected a position from 1 to {len(waiting)}")
            waiting.remove(entry)
            waiting.insert(to - 1, entry)
            neighbour = waiting[to] if to < len(waiting) else waiting[to - 2] if len(waiting) > 1 else entry
            entry.priority = neighbour.priority
            for i, e in enumerate(waiting):
                e.position = float(i + 1)
                self.save(e)
        return waiting

    def set_paused(self, paused: bool) -> None:
        self.ensure()
        if paused:
            atomic_write_text(self.paused_flag, f"paused at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        else:
            with contextlib.suppress(FileNotFoundError):
                self.paused_flag.unlink()


def _refuse_duplicate(given: Path, source: str, run_dir: str, entries: list[Entry]) -> None:
    """``DuplicateEntry`` when an active entry has the same source file or the same run dir."""
    for e in entries:
        if e.state not in ACTIVE or (e.source != source and e.run_dir != run_dir):
            continue
        same = "same file" if e.source == source else f"same run dir {run_dir}"
        then = (f"stop it first (trainsup stop {e.id})" if e.state == "running"
                else f"remove it first (trainsup queue remove {e.id})")
        raise DuplicateEntry(f"{given}: already in the queue as {e.id} ({e.state}; project {e.project}, {same}); "
                             f"{then} or wait until it ends")


def order_key(entry: Entry) -> tuple[int, float, int]:
    return (-entry.priority, entry.position, entry.seq)


def queued_positions(entries: list[Entry]) -> dict[str, int]:
    """1-based places of the queued entries, in the order they will start."""
    return {e.id: i + 1 for i, e in enumerate(e for e in sorted(entries, key=order_key) if e.state == "queued")}


def counts(entries: list[Entry]) -> dict[str, int]:
    return {state: sum(1 for e in entries if e.state == state) for state in STATES}


def _project_gpus(env: Mapping[str, str]) -> list[str] | None:
    raw = env.get("CUDA_VISIBLE_DEVICES")
    return [g.strip() for g in raw.split(",") if g.strip()] if raw else None


def _plain(entry_id: str) -> bool:
    return bool(entry_id) and "/" not in entry_id and entry_id not in (".", "..")
