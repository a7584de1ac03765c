"""Owns capturing the Python stacks of a hung process tree, with ``py-spy dump``.

py-spy reads the trainer's memory with ptrace. As the same user that is allowed wherever the
kernel's Yama ``ptrace_scope`` is 0; where it is 1 (Ubuntu's default) py-spy, a sibling of the
trainer rather than its ancestor, needs ``CAP_SYS_PTRACE`` (root has it; a ``User=`` service gets it
with ``AmbientCapabilities=``, see the unit). A refusal is written into the report, never raised.
Every Python process of the tree is dumped (accelerate's launcher, the trainer, its
DataLoader workers) into one text file; the innermost frame of each process's main thread is what a
hang's evidence names. Without py-spy the file says so, and supervision goes on.

With ranks (``sensors.ranks``) the report says where each rank is: stopped (a SIGSTOP, a debugger), in a
``torch.distributed`` collective (its innermost frame in ``distributed_c10d.py``), or elsewhere; and
names the straggler: the stopped ranks, else the ones outside a collective the others wait in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from .hang import HangClock, hang_evidence, hang_groups
from .ranks import Rank

# `Thread 0x7F3A (idle): "MainThread"`, or without the name (`Thread 13604 (active+gil)`).
_THREAD = re.compile(r'^Thread (?:0x[0-9A-Fa-f]+|\d+) \([^)]*\)(?:: "(?P<name>[^"]*)")?')
_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<where>[^()]*:\d+)\)\s*$")


@dataclass(frozen=True)
class ProcessStack:
    pid: int
    command: str
    innermost: str | None  # "func (file.py:123)" of the main thread, when py-spy read it
    text: str  # py-spy's dump, or why there is none


def python_tree(root_pid: int) -> list[psutil.Process]:
    """The root process and its descendants that run a Python interpreter."""
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    found = []
    for proc in tree:
        try:
            name = proc.name().lower()
            exe = Path(proc.cmdline()[0]).name.lower() if proc.cmdline() else ""
        except psutil.Error:
            continue
        if "python" in name or "python" in exe:
            found.append(proc)
    return found


def _main_frames(dump: str) -> Iterator[tuple[str, str]]:
    """``(function, file:line)`` of each frame of the main thread in a py-spy dump, innermost first."""
    in_main, threads = False, 0
    for line in dump.splitlines():
        m = _THREAD.match(line)
        if m is not None:
            threads += 1
            # py-spy lists the main thread first; it names it when it can
            in_main = m.group("name") == "MainThread" or (m.group("name") is None and threads == 1)
            continue
        f = _FRAME.match(line) if in_main else None
        if f is not None:
            yield f.group("func"), f.group("where").replace("\\", "/").rsplit("/", 1)[-1]


def innermost_main_frame(dump: str) -> str | None:
    """``func (file:line)`` of the first frame of the main thread in a py-spy dump."""
    for func, where in _main_frames(dump):
        return f"{func} ({where})"
    return None


def collective_of(dump: str) -> str | None:
    """The ``torch.distributed`` call the main thread waits in (its innermost frame in
    ``distributed_c10d.py``, or one of DDP's own, whose collectives run in C++ under it: seen on sd-scripts'
    two ranks, the rank left waiting for a stopped one in ``DistributedDataParallel._pre_forward`` or in the
    buffers' broadcast inside it), else None. A rank held in autograd's backward past the hang timeout waits
    in the gradients' all-reduce, which DDP (FSDP, DeepSpeed: their reductions) runs from the backward's hooks in
    C++: seen on the same ranks, rank 0 in ``_engine_run_backward`` while rank 1 was stopped."""
    for func, where in _main_frames(dump):
        if where.startswith("distributed_c10d.py:") or func.startswith("DistributedDataParallel."):
            return func
        if func == "_engine_run_backward" and where.startswith("graph.py:"):
            return "the backward's gradient all-reduce (_engine_run_backward)"
    return None


@dataclass(frozen=True)
class RankSpot:
    rank: int | None
    pid: int
    stopped: bool  # its state was T or t (SIGSTOP, a debugger) before the stacks were taken
    collective: str | None
    innermost: str | None

    def says(self) -> str:
        where = "stopped" if self.stopped else f"in {self.collective}" if self.collective else \
            f"elsewhere ({self.innermost or 'no stack'})"
        return f"rank {self.rank} {where}"


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def rank_spots(ranks: list[Rank], stopped: set[int], taken: list[ProcessStack]) -> list[RankSpot]:
    by_pid = {t.pid: t for t in taken}
    out = []
    for r in ranks:
        found = by_pid.get(r.pid)
        out.append(RankSpot(r.rank, r.pid, r.pid in stopped, collective_of(found.text) if found else None,
                            found.innermost if found else None))
    return out


def stragglers(spots: list[RankSpot]) -> list[RankSpot]:
    """The ranks the others wait for: the stopped ones; else, where some wait in a collective, the rest."""
    held = [s for s in spots if s.stopped]
    if held:
        return held
    waiting = [s for s in spots if s.collective]
    return [s for s in spots if not s.collective] if waiting and len(waiting) < len(spots) else []


def ranks_sentence(spots: list[RankSpot]) -> str:
    """``ranks: rank 0 in all_reduce, rank 1 stopped: rank 1 is the straggler`` (empty without ranks)."""
    if len(spots) < 2:
        return ""
    late = stragglers(spots)
    tail = f": {', '.join(f'rank {s.rank}' for s in late)} {'is' if len(late) == 1 else 'are'} the straggler" \
        f"{'' if len(late) == 1 else 's'}" if late else ": no rank stands out"
    return "ranks: " + ", ".join(s.says() for s in spots) + tail


def find_py_spy() -> str | None:
    """py-spy beside this interpreter first (a venv or pipx install: a service's PATH lacks its bin
    dir), then on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def capture(root_pid: int, timeout_s: float = 20.0) -> list[ProcessStack]:
    """Dump every Python process under ``root_pid``; never raises."""
    spy = find_py_spy()
    stacks = []
    for proc in python_tree(root_pid):
        try:
            command = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if spy is None:
            stacks.append(ProcessStack(proc.pid, command, None, "py-spy is not installed: no stacks"))
            continue
        text = _dump(spy, proc.pid, timeout_s)
        stacks.append(ProcessStack(proc.pid, command, innermost_main_frame(text), text))
    return stacks


def _dump(spy: str, pid: int, timeout_s: float) -> str:
    """py-spy's dump of one process. py-spy pauses a process to read a consistent stack; one that is
    stopped already (SIGSTOP, a debugger) cannot be paused again, so it is read without pausing."""
    failure = ""
    for extra in ([], ["--nonblocking"]):
        try:
            done = subprocess.run([spy, "dump", "--pid", str(pid), *extra], capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"py-spy failed: {exc}"
        if done.returncode == 0:
            return done.stdout
        failure = " / ".join(done.stderr.strip().splitlines()[:3])
    return f"py-spy failed: {failure}"


def write_report(stacks: list[ProcessStack], path: Path, header: str) -> None:
    """The stacks as one text file (``RUN_DIR/hang-N.txt``)."""
    parts = [header, ""]
    for s in stacks:
        parts += [f"=== pid {s.pid}: {s.command}", s.text.rstrip(), ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")


def hang_report(root_pid: int, idle_s: float, clock: HangClock, step: int | None, gpu: str | None,
                path: Path, ranks: list[Rank] | None = None) -> tuple[str, dict[str, str], list[ProcessStack],
                                                                     str | None]:
    """Take the tree's stacks at a hang and write them to ``path`` under the hang's evidence line.

    Returns the evidence, its named groups (``hang_groups``: the spot; ``straggler``: the ranks the others
    wait for), the stacks, and why the report could not be written (``None``: written).
    """
    stopped = {r.pid for r in ranks or [] if _stopped(r.pid)}  # before py-spy pauses them itself
    taken = capture(root_pid)
    frames = [f"pid {s.pid} {s.innermost}" for s in taken if s.innermost]
    waits = any("dataloader.py" in s.text for s in taken)
    text = hang_evidence(idle_s, clock, step, frames, waits, gpu)
    groups = hang_groups(step, frames)
    spots = rank_spots(ranks or [], stopped, taken)
    if said := ranks_sentence(spots):
        text += f"; {said}"
        late = stragglers(spots)
        if late:
            groups["straggler"] = ",".join(str(s.rank) for s in late)
    try:
        write_report(taken, path, text)
    except OSError as exc:
        return text, groups, taken, exc.strerror or str(exc)
    return text, groups, taken, None
