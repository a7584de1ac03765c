"""Owns the box's index of runs: each supervisor registers its run dir, so that ``trainsup status``
and ``trainsup web`` find a run however it was started (by hand, by a project, by the queue).

One small JSON file per run dir, ``RUNS/<hash>.json``, the hash being of the resolved run dir (the same
run dir, started again, rewrites its own file), written atomically (``fsutil.atomic_write_text``)::

    {"run_dir": "/home/me/lora/out/.trainsup", "name": "lora", "pid": 4242, "host": "box",
     "user": "me", "registered": 1718000000.0, "argv": ["python", "train_network.py", ...]}

``RUNS`` is ``$TRAINSUP_RUNS``, else ``STATE/runs`` where ``STATE`` is the queue's state directory
(``state_root``: ``$TRAINSUP_STATE``, else ``/var/lib/trainsup`` for root and
``$XDG_STATE_HOME/trainsup``, i.e. ``~/.local/state/trainsup``, for anyone else). A user's reader also
reads the system's index (``/var/lib/trainsup/runs``, where root's runs are), unless either variable
names the index. An entry whose run dir is gone is dropped by the reader that finds it so (where it
may delete it); an entry of a run dir not written for ``RECENT_S`` is kept but not listed.

The index says only where runs are: how a run stands is read from its run dir (``status.json``, its
lock), as for a run dir named by hand. Registering is a convenience, never a reason to stop a run: a
file that cannot be written is counted (``Registrar.write_errors``) and the run goes on.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fsutil import atomic_write_text
from .journalkinds import RUN_START

__all__ = ["RECENT_S", "Registrar", "Registration", "entry_name", "index_dir", "index_dirs", "register", "registered",
           "state_root"]

SYSTEM_STATE = Path("/var/lib/trainsup")
RECENT_S = 7 * 86400.0  # an ended run is listed for a week after its run dir was last written
_MARKERS = ("status.json", "events.jsonl", "lock")


def state_root(env: Mapping[str, str] = os.environ) -> Path:
    """trainsup's state directory when none is given: ``$TRAINSUP_STATE``, else ``/var/lib/trainsup``
    for root, else ``$XDG_STATE_HOME/trainsup`` (``~/.local/state/trainsup``)."""
    if env.get("TRAINSUP_STATE"):
        return Path(env["TRAINSUP_STATE"]).expanduser().absolute()
    if os.geteuid() == 0:
        return SYSTEM_STATE
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "trainsup"


def index_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where this process registers its runs."""
    if env.get("TRAINSUP_RUNS"):
        return Path(env["TRAINSUP_RUNS"]).expanduser().absolute()
    return state_root(env) / "runs"


def index_dirs(env: Mapping[str, str] = os.environ) -> list[Path]:
    """Every index a reader reads: its own, then the system's (root's runs) when neither variable
    names the index."""
    own = index_dir(env)
    dirs = [own]
    system = SYSTEM_STATE / "runs"
    if not env.get("TRAINSUP_RUNS") and not env.get("TRAINSUP_STATE") and system != own:
        dirs.append(system)
    return dirs


def entry_name(run_dir: Path) -> str:
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:20] + ".json"


@dataclass(frozen=True)
class Registration:
    run_dir: Path
    name: str
    registered: float
    pid: int | None = None
    host: str | None = None
    user: str | None = None
    argv: tuple[str, ...] = ()

    def last_written(self) -> float:
        """When the run dir's record was last written (its registration, at least)."""
        times = [self.registered]
        for marker in _MARKERS:
            with contextlib.suppress(OSError):
                times.append((self.run_dir / marker).stat().st_mtime)
        return max(times)


def register(run_dir: Path, name: str, argv: list[str] | tuple[str, ...] = (),
             env: Mapping[str, str] = os.environ, clock: Any = time.time) -> Path:
    """Write (or rewrite) ``run_dir``'s entry; raises ``OSError`` when it cannot."""
    folder = index_dir(env)
    system = folder == SYSTEM_STATE / "runs"
    folder.mkdir(mode=0o755 if system else 0o700, parents=True, exist_ok=True)
    resolved = run_dir.resolve()
    try:
        user: str | None = getpass.getuser()
    except (KeyError, OSError):
        user = None
    record = {"run_dir": str(resolved), "name": name, "pid": os.getpid(), "host": socket.gethostname(),
              "user": user, "registered": round(clock(), 3), "argv": [str(a) for a in argv]}
    path = folder / entry_name(resolved)
    atomic_write_text(path, json.dumps(record, ensure_ascii=False) + "\n")
    if system:  # users list root's runs too (the run dirs say what they may read)
        os.chmod(path, 0o644)
    return path


def _parse(path: Path) -> Registration | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # being replaced, unreadable, or not ours
    if not isinstance(data, dict) or not isinstance(data.get("run_dir"), str) or not data["run_dir"]:
        return None
    argv = data.get("argv")
    registered = data.get("registered")
    pid = data.get("pid")
    return Registration(
        Path(data["run_dir"]), str(data.get("name") or Path(data["run_dir"]).name),
        float(registered) if isinstance(registered, (int, float)) and not isinstance(registered, bool) else 0.0,
        pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        str(data["host"]) if data.get("host") else None, str(data["user"]) if data.get("user") else None,
        tuple(str(a) for a in argv) if isinstance(argv, list) else ())


def registered(env: Mapping[str, str] = os.environ, *, now: float | None = None,
               within_s: float | None = RECENT_S) -> list[Registration]:
    """The registered runs whose run dirs exist, newest first (``within_s``: only those written that
    recently; ``None``: all). An entry whose run dir is gone is deleted where this process may."""
    now = time.time() if now is None else now
    found: dict[Path, tuple[float, Registration]] = {}
    for folder in index_dirs(env):
        try:
            names = sorted(p for p in folder.iterdir() if p.suffix == ".json")
        except OSError:
            continue
        for path in names:
            entry = _parse(path)
            if entry is None:
                continue
            if not entry.run_dir.is_dir():
                with contextlib.suppress(OSError):
                    path.unlink()  # the run dir was removed or moved: its entry goes with it
                continue
            written = entry.last_written()
            if within_s is not None and now - written > within_s:
                continue
            if entry.run_dir not in found:
                found[entry.run_dir] = (written, entry)
    return [entry for _, entry in sorted(found.values(), key=lambda pair: -pair[0])]


class Registrar:
    """A journal listener that registers the run at its ``run_start`` record (every supervisor writes
    one as it begins, a resumed or handed-over run included)."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.env = env
        self.write_errors = 0
        self.path: Path | None = None

    def on_event(self, record: dict[str, Any]) -> None:
        if record.get("event") != RUN_START or not isinstance(record.get("run_dir"), str):
            return
        argv = record.get("argv")
        try:
            self.path = register(Path(record["run_dir"]), str(record.get("project") or ""),
                                 argv if isinstance(argv, list) else (), self.env)
        except OSError:
            self.write_errors += 1  # the run goes on; `trainsup status RUN_DIR` still finds it

    def on_status(self, snapshot: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None
