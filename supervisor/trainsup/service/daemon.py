"""Owns ``trainsup serve``: the box's daemon that works through the queue, one supervisor per entry.

One event queue and one loop, like the supervisor's: the control socket, the inbox watcher and the
signal handlers only put events; the loop reaps ended entries, takes inbox drops, starts what the
scheduler allows, and says how things stand (``STATE/status.json``, ``STATE/events.jsonl``, systemd's
STATUS line and watchdog).

Its own death loses nothing: on start it looks at every entry the files call running. A supervisor
still alive is adopted, never started twice; one that died is started again on the same run dir, where
it takes the dead one's run over and resumes from the newest complete state; a run that ended while no
daemon watched gets its ending from its journal. ``SIGTERM`` (``systemctl stop``) asks every running
supervisor to stop (they stop their trainers within ``stop.grace_s``) and puts those entries back in
the queue, at their place: they resume when the daemon starts again.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..record.journal import Journal
from ..record.runlock import LockHeld, RunLock, holder
from ..run.policy import Policy
from ..run.sdnotify import Notifier
from ..sensors import gpu
from ..sensors.gpuwatch import visible_devices
from ..sensors.watch import FileWatcher
from . import entryproc, inbox
from .control import ControlServer, Request
from .queuereport import QueueReporting
from .queuestore import Entry, QueueStore, counts
from .scheduler import plan_starts

KNOWN_EXITS = frozenset({0, 2, 3, 4, 70, 130, 143})  # trainsup run's documented exit codes


class GpuReadError(RuntimeError):
    """NVML is there but its answer could not be read this time."""


@dataclass(frozen=True)
class ServeOptions:
    state: Path
    slots: int | None = None  # None: one per visible GPU, or 1 without GPUs
    min_free_mib: int = 2048  # a GPU with less free than this is not offered to an entry
    poll_s: float = 1.0
    max_lost: int = 3  # supervisor deaths one entry may survive before it is failed
    stop_timeout_s: float = 100.0  # on SIGTERM: how long to wait for the supervisors to stop
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    policy: Policy = field(default_factory=Policy)  # serve --policy: its notify: and metrics: sections


class Daemon:
    def __init__(self, opts: ServeOptions, *, gpu_probe: Callable[[], gpu.GpuProbe] = gpu.probe,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.opts = opts
        self.store = QueueStore(opts.state)
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.notifier = Notifier(opts.env, clock)
        self.gpu_probe = gpu_probe
        self.stop_signal: int | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.adopted: dict[str, psutil.Process] = {}
        self.shutting_down = False
        self.inbox_pending = True
        self._was_busy = False
        self._gpu_unreadable = False

    def request_stop(self, signum: int) -> None:
        self.stop_signal = signum
        self.events.put(("signal", signum))

    # --- the loop --------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.store.ensure()
            self.lock = RunLock(self.store.root)
            self.lock.acquire()
        except LockHeld:
            sup = holder(self.store.root)
            self.say(f"error: another trainsup serve (pid {sup.pid if sup else '?'}) uses {self.store.root}")
            return 2
        except OSError as exc:
            self.say(f"error: cannot use the state directory {self.store.root}: {exc.strerror or exc}")
            return 2
        self.journal = Journal(self.store.root)
        self.reporting = QueueReporting(self.opts.policy, self.store, self.journal,
                                        lambda message: self.say(f"warning: {message}"), self.opts.env)
        self.probe = self.gpu_probe()
        try:
            self.slots = self.opts.slots or max(1, len(self._devices() or []))
        except GpuReadError:
            self.slots = self.opts.slots or 1
        self.journal.event("serve_start", pid=os.getpid(), slots=self.slots, gpu=self.probe.reason)
        self.say(f"state dir {self.store.root}; {self.slots} slot(s); GPUs: {self.probe.reason}")
        self.control = ControlServer(self.store.socket_path, self.events)
        self.control.start()
        self.watcher = FileWatcher(lambda _path, _kind: self.events.put(("inbox", None)), 0.3)
        self.watcher.watch_tree(self.store.inbox, inbox.SUFFIXES)
        self.watcher.start()
        try:
            self._recover()
            self.notifier.ready()
            while self.stop_signal is None:
                self._step()
                self._wait(self.opts.poll_s)
            self._shutdown()
        finally:
            self._close()
        return 0

    def _step(self) -> None:
        self.notifier.tick()
        self._reap()
        if self.inbox_pending:
            self.inbox_pending = inbox.take(self.store, self.journal, self.say)
        self._schedule()
        self._publish()

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.stop_signal is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                kind, payload = self.events.get(timeout=left)
            except queue.Empty:
                return
            if kind == "inbox":
                self.inbox_pending = True
                return
            if kind == "control":
                self._control(payload)
                return

    def _control(self, request: Request) -> None:
        op = request.body.get("op")
        if op == "wake":
            request.answer({"ok": True})
        elif op == "status":
            entries = self.store.entries()
            request.answer({"ok": True, "pid": os.getpid(), "slots": self.slots, "paused": self.store.paused(),
                            "counts": counts(entries)})
        else:
            request.answer({"ok": False, "error": f"unknown op {op!r}; expected wake or status"})

    # --- starting --------------------------------------------------------------------------------
    def _devices(self) -> list[gpu.GpuDevice] | None:
        """The GPUs entries may get (None: no driver, or none visible: the slots alone decide);
        ``GpuReadError`` when NVML answers but cannot be read now."""
        if not self.probe.available:
            return None
        try:
            devices = visible_devices(self.probe.devices(), self.opts.env.get("CUDA_VISIBLE_DEVICES"))
        except Exception as exc:  # noqa: BLE001 - NVML's errors are many; "unknown" is the answer
            raise GpuReadError(str(exc)) from None
        return devices or None

    def _schedule(self) -> None:
        entries = self.store.entries()
        if self.store.paused() or not any(e.state == "queued" for e in entries):
            return
        try:
            devices = self._devices()
        except GpuReadError as exc:
            if not self._gpu_unreadable:  # once per spell, not every second
                self.say(f"warning: cannot read the GPUs ({exc}); starting nothing until they answer")
            self._gpu_unreadable = True
            return
        self._gpu_unreadable = False
        ours = {e.run_dir for e in entries if e.state == "running"}
        busy = [e.run_dir for e in entries
                if e.state == "queued" and e.run_dir not in ours and holder(Path(e.run_dir)) is not None]
        for start in plan_starts(entries, slots=self.slots, paused=False, devices=devices, busy_run_dirs=busy,
                                 min_free_bytes=self.opts.min_free_mib * 2**20):
            self._launch(start.entry.id, start.gpus, first=True)

    def _launch(self, entry_id: str, gpus: list[str] | None, first: bool) -> None:
        with self.store.locked():
            entry = self.store.find(entry_id)
            if entry is None or (first and entry.state != "queued"):
                return  # removed or stopped from the command line meanwhile
            entry = self.store.update(entry_id, state="running", started=entry.started or round(time.time(), 3),
                                      assigned_gpus=gpus, exit_code=None, reason=None, pid=None)
            try:
                child = entryproc.launch(entry, gpus, self.opts.env)
            except OSError as exc:
                self.store.update(entry_id, state="failed", reason=f"cannot start its supervisor: {exc}",
                                  ended=round(time.time(), 3))
                self.say(f"entry={entry_id} state=failed reason=cannot start its supervisor: {exc}")
                return
            self.store.update(entry_id, pid=child.pid, pid_started=entryproc.create_time(child.pid),
                              launches=entry.launches + 1)
        self.children[entry_id] = child
        self.journal.event("entry_started", id=entry_id, project=entry.project, pid=child.pid, gpus=gpus,
                           launch=entry.launches + 1, run_dir=entry.run_dir)
        self.say(f"entry={entry_id} project={entry.project} state=running pid={child.pid}"
                 f"{' gpus=' + ','.join(gpus) if gpus else ''}{'' if first else ' (resuming its run)'}")

    # --- ending ----------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Entries the files call running: adopt a live supervisor, else settle or resume the run."""
        for entry in self.store.entries():
            if entry.state != "running":
                continue
            proc = entryproc.live_supervisor(entry)
            if proc is not None:
                self.adopted[entry.id] = proc
                with self.store.locked():
                    self.store.update(entry.id, pid=proc.pid, pid_started=entryproc.create_time(proc.pid))
                self.journal.event("entry_adopted", id=entry.id, pid=proc.pid)
                self.say(f"entry={entry.id} still running under pid {proc.pid}: adopted, not started again")
            else:
                self._ended(entry.id, None)

    def _reap(self) -> None:
        for entry_id, child in list(self.children.items()):
            code = child.poll()
            if code is not None:
                del self.children[entry_id]
                self._ended(entry_id, code)
        for entry_id, proc in list(self.adopted.items()):
            try:
                gone = not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                gone = True
            if gone:
                del self.adopted[entry_id]
                self._ended(entry_id, None)

    def _ended(self, entry_id: str, code: int | None) -> None:
        """An entry's supervisor is gone (``code``: its exit status, ``None`` when it was not our child)."""
        entry = self.store.find(entry_id)
        if entry is None:
            return
        ending = entryproc.journal_ending(entry)
        if code is not None and code in KNOWN_EXITS:
            state = entryproc.state_for(code, entry.stop_requested)
            reason = ending.reason if ending is not None else entryproc.log_reason(entry)
            self._settle(entry, state, code, reason)
        elif ending is not None:
            self._settle(entry, ending.state, ending.exit_code, ending.reason)
        elif entry.stop_requested:
            self._settle(entry, "stopped", code, "stopped before its run began")
        elif self.shutting_down:
            self._requeue(entry)
        else:
            how = "was killed" if code is None or code < 0 else f"exited {code}"
            lost = int(entry.extra.get("lost", 0)) + 1
            with self.store.locked():
                self.store.update(entry_id, extra={**entry.extra, "lost": lost})
            self.journal.event("entry_lost", id=entry_id, exit_code=code, lost=lost)
            if lost > self.opts.max_lost:
                self._settle(entry, "failed", code, f"its supervisor died {lost} times (last: it {how})")
                return
            self.say(f"entry={entry_id}: its supervisor {how}; starting it again to resume its run")
            self._launch(entry_id, entry.assigned_gpus, first=False)

    def _settle(self, entry: Entry, state: str, code: int | None, reason: str | None) -> None:
        if state == "stopped" and self.shutting_down and not entry.stop_requested:
            self._requeue(entry)
            return
        with self.store.locked():
            self.store.update(entry.id, state=state, exit_code=code, reason=reason, ended=round(time.time(), 3),
                              pid=None)
        self.journal.event("entry_ended", id=entry.id, project=entry.project, state=state, exit_code=code,
                           reason=reason)
        self.say(f"entry={entry.id} project={entry.project} state={state} exit={code} reason={reason}")

    def _requeue(self, entry: Entry) -> None:
        reason = "interrupted when trainsup serve stopped; it resumes when serve starts again"
        with self.store.locked():
            self.store.update(entry.id, state="queued", reason=reason, pid=None)
        self.journal.event("entry_requeued", id=entry.id, reason=reason)
        self.say(f"entry={entry.id} back in the queue: {reason}")

    # --- stopping --------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Ask every running supervisor to stop, wait for them, and queue their entries again."""
        self.shutting_down = True
        running = {**{k: c.pid for k, c in self.children.items()}, **{k: p.pid for k, p in self.adopted.items()}}
        if running:
            self.say(f"stopping {len(running)} running entr{'y' if len(running) == 1 else 'ies'}; "
                     "they resume when serve starts again")
            self.notifier.stopping(f"stopping {len(running)} run(s)")
        for pid in running.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.opts.stop_timeout_s
        while (self.children or self.adopted) and time.monotonic() < deadline:
            self.notifier.tick()
            self._reap()
            time.sleep(0.1)
        if self.children or self.adopted:
            self.say(f"warning: {len(self.children) + len(self.adopted)} supervisor(s) still running after "
                     f"{self.opts.stop_timeout_s:g} s; the next serve adopts them")
        self._publish()

    def _close(self) -> None:
        for part in ("watcher", "control"):
            with contextlib.suppress(Exception):
                getattr(self, part).stop()
        self.reporting.close()
        self.journal.status(state="stopped", pid=os.getpid())  # never "serving" once it has gone
        self.journal.event("serve_stop", signal=self.stop_signal)
        self.journal.close()
        self.probe.close()
        self.notifier.stopping("stopped")
        self.notifier.close()
        self.lock.release()

    # --- telling ---------------------------------------------------------------------------------
    def _publish(self) -> None:
        entries = self.store.entries()
        n = counts(entries)
        paused = self.store.paused()
        self.journal.status(state="stopping" if self.shutting_down else "serving", pid=os.getpid(), slots=self.slots,
                            paused=paused, **n)
        self.notifier.status(status_text(n, paused))
        busy = n["running"] + n["queued"] > 0
        if self._was_busy and not busy and not self.shutting_down:
            self.journal.event("queue_empty", **n)
            self.say("the queue is empty: " + status_text(n, paused))
            self.reporting.queue_empty(n, status_text(n, paused))
        self._was_busy = busy
        self.reporting.published()

    def say(self, message: str) -> None:
        print(f"trainsup serve: {message}", file=sys.stderr, flush=True)


def status_text(n: Mapping[str, int], paused: bool) -> str:
    """``2 running · 3 queued · 5 finished · 1 failed`` (what systemctl status shows)."""
    parts = [f"{n.get(s, 0)} {s}" for s in ("running", "queued", "finished", "failed")]
    if n.get("stopped"):
        parts.append(f"{n['stopped']} stopped")
    return " · ".join(parts) + (" · paused" if paused else "")


def install_signal_handlers(daemon: Daemon) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: daemon.request_stop(signum))
