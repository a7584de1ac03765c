"""Owns ``trainsup logs``: printing an attempt's log, and following a run's logs as it goes.

An attempt log holds every byte the trainer printed (progress-bar redraws, colour codes, whatever
encoding it used), so it is copied as bytes, never decoded. Following polls: the logs are local
files appended by one writer, and a poll every 0.2 s costs nothing beside a training run.

Following moves on to the next attempt's log when it appears (the supervisor starts attempt N+1
only after attempt N's output is drained, so N's log is read to its end first), and ends when no
supervisor holds the run dir's lock and every log is printed. "No supervisor" is asked *before*
each read: a supervisor found gone has written its last byte, so the read that follows gets all.
In follow mode each log begins with a ``==> attempt-N.log <==`` line on stderr, so that stdout
stays exactly the trainer's bytes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO, TextIO

from ..record.runlock import holder
from .runref import RefError, attempt_logs, resolve

__all__ = ["run_logs"]

EXIT_OK = 0
EXIT_NO_LOG = 1
EXIT_USAGE = 2
POLL_S = 0.2
CHUNK = 1 << 20


def run_logs(arg: str, *, attempt: int | None, follow: bool, env: Mapping[str, str], out: BinaryIO,
             err: TextIO, poll_s: float = POLL_S, sleep: Callable[[float], None] = time.sleep) -> int:
    """Print attempt ``attempt`` (default: the newest) of the run ``arg`` names; follow it with ``follow``."""
    try:
        run_dir = resolve(arg, env).usable()
    except RefError as exc:
        print(f"trainsup logs: error: {exc}", file=err)
        return EXIT_USAGE
    logs = attempt_logs(run_dir)
    if attempt is not None and attempt not in logs:
        have = f"attempts {', '.join(map(str, sorted(logs)))}" if logs else "no attempt yet"
        print(f"trainsup logs: error: no attempt-{attempt}.log in {run_dir} ({have})", file=err)
        return EXIT_NO_LOG
    first = attempt if attempt is not None else max(logs, default=None)
    try:
        if follow:
            if first is None and holder(run_dir) is None:
                raise _Unreadable(f"no attempt log in {run_dir} and no supervisor running there")
            return _follow(run_dir, first, out, err, poll_s, sleep)
        if first is None:
            raise _Unreadable(f"no attempt log in {run_dir} (yet): no trainer was launched there")
        with _open(logs[first]) as fh:
            _pump(fh, out)
        return EXIT_OK
    except _Unreadable as exc:
        print(f"trainsup logs: error: {exc}", file=err)
        return EXIT_NO_LOG


class _Unreadable(Exception):
    """No log to show, or one that cannot be opened: exit 1 with this message."""


def _open(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")  # the caller closes it
    except OSError as exc:
        raise _Unreadable(f"cannot read {path}: {exc.strerror or exc}") from None


def _follow(run_dir: Path, number: int | None, out: BinaryIO, err: TextIO, poll_s: float,
            sleep: Callable[[float], None]) -> int:
    """Print log ``number`` (none yet: the first to appear) and every later one until the run ends."""
    fh: BinaryIO | None = None
    try:
        if number is not None:
            fh = _start(run_dir / f"attempt-{number}.log", out, err)
        while True:
            alive = holder(run_dir) is not None  # asked first: see the module docstring
            moved = fh is not None and _pump(fh, out)
            newer = [n for n in attempt_logs(run_dir) if number is None or n > number]
            if newer:
                if fh is not None:
                    _pump(fh, out)  # what landed between the read above and the listing
                    fh.close()
                number = min(newer)
                fh = _start(run_dir / f"attempt-{number}.log", out, err)
                continue
            if not moved:
                if not alive:
                    return EXIT_OK
                sleep(poll_s)
    finally:
        if fh is not None:
            fh.close()


def _start(path: Path, out: BinaryIO, err: TextIO) -> BinaryIO:
    out.flush()  # the header must not overtake bytes of the previous log on a shared terminal
    print(f"==> {path.name} <==", file=err, flush=True)
    return _open(path)


def _pump(fh: BinaryIO, out: BinaryIO) -> bool:
    """Copy what ``fh`` has past its position to ``out``; whether there was anything."""
    moved = False
    while chunk := fh.read(CHUNK):
        out.write(chunk)
        moved = True
    if moved:
        out.flush()
    return moved
