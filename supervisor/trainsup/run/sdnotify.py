"""Owns telling systemd how the run stands: the sd_notify protocol (``Type=notify`` units).

The protocol is one datagram of ``KEY=VALUE`` lines to the ``AF_UNIX`` socket named by
``$NOTIFY_SOCKET`` (an abstract socket when the name starts with ``@``). Without the variable
nothing is sent and nothing costs. ``READY=1`` goes once the first attempt is launched; ``STATUS=``
is one line that ``systemctl status`` shows, sent at most every ``STATUS_INTERVAL_S`` and only when
it changed; ``WATCHDOG=1`` goes from the decision loop's ticks at half the interval systemd asked for
(``$WATCHDOG_USEC``, for our pid when ``$WATCHDOG_PID`` names one), so it proves that loop is alive;
``STOPPING=1`` on the way out. A send that fails (systemd restarting, the socket gone) is dropped:
telling systemd must never end supervision.

Why not a library: the maintained one (``systemd-python``) builds against libsystemd's headers,
which a registry install on a training box often lacks, and the protocol is a single datagram.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

from ..record.textfmt import eta_seconds, progress_parts

STATUS_INTERVAL_S = 2.0


class Notifier:
    def __init__(self, env: Mapping[str, str], clock: Callable[[], float]) -> None:
        self.clock = clock
        name = env.get("NOTIFY_SOCKET") or ""
        self.address: str | None = ("\0" + name[1:]) if name.startswith("@") else (name or None)
        self.watchdog_s: float | None = None
        usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
        if self.address and usec and usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self._sock: socket.socket | None = None
        self._ready = False
        self._status_sent = ""
        self._status_at = float("-inf")
        self._pending_status = ""
        self._pinged_at = float("-inf")

    @property
    def on(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> bool:
        if self.address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode("utf-8", "replace"), self.address)
            return True
        except OSError:
            return False

    def ready(self) -> None:
        if not self._ready:
            self._ready = True
            self.send("READY=1", f"MAINPID={os.getpid()}")

    def status(self, text: str) -> None:
        """Keep ``text`` as the status line; it goes out at the next tick that is due."""
        self._pending_status = text.replace("\n", " ")
        self.tick()

    def tick(self) -> None:
        """Called by the decision loop every pass: the watchdog ping and a due status line."""
        if self.address is None:
            return
        now = self.clock()
        if self.watchdog_s is not None and now - self._pinged_at >= self.watchdog_s / 2:
            self._pinged_at = now
            self.send("WATCHDOG=1")
        if self._pending_status != self._status_sent and now - self._status_at >= STATUS_INTERVAL_S:
            self._status_at, self._status_sent = now, self._pending_status
            self.send(f"STATUS={self._pending_status}")

    def stopping(self, text: str) -> None:
        self._status_sent = self._pending_status = text
        self.send("STOPPING=1", f"STATUS={text}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def status_line(status: Mapping[str, Any]) -> str:
    """One line of a run's state, e.g. ``running · attempt 2 · step 812/2000 · loss 0.083 · 1.9 it/s ·
    eta 10m25s · last fault cuda_oom``; fields that are not known are left out."""
    parts = [str(status.get("state") or "starting")]
    if status.get("attempt") is not None:
        parts.append(f"attempt {status['attempt']}")
    step, total, rate = status.get("step"), status.get("total"), status.get("rate")
    parts.extend(progress_parts(step, total, status.get("loss"), rate, eta_s=eta_seconds(step, total, rate)))
    if status.get("last_fault"):
        parts.append(f"last fault {status['last_fault']}")
    return " · ".join(parts)
