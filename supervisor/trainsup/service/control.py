"""Owns the daemon's control socket: ``STATE/serve.sock``, a Unix stream socket only its owner can open.

The queue's truth is its files; the socket is for what must happen at once: a ``queue add``, ``move``,
``resume`` or inbox drop wakes the daemon so the entry starts now rather than at its next look, and
``status`` answers how the daemon stands. One request per connection: a JSON object on one line, one
JSON line back. The socket is created with mode 0600 inside a 0700 directory, and a peer whose uid
is not the daemon's is refused as well (``SO_PEERCRED``). No TCP port, ever.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import struct
import threading
from pathlib import Path
from typing import Any

MAX_REQUEST = 65536
ANSWER_TIMEOUT_S = 5.0


class Request:
    """One request from the socket, answered by the decision loop."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self._answer: dict[str, Any] | None = None
        self._done = threading.Event()

    def answer(self, reply: dict[str, Any]) -> None:
        self._answer = reply
        self._done.set()

    def wait(self) -> dict[str, Any]:
        if not self._done.wait(ANSWER_TIMEOUT_S):
            return {"ok": False, "error": "the daemon did not answer in time"}
        return self._answer or {"ok": True}


class ControlServer(threading.Thread):
    """Accepts requests and puts ``("control", Request)`` on the daemon's event queue."""

    def __init__(self, path: Path, events: queue.Queue[tuple[str, Any]]) -> None:
        super().__init__(name="trainsup-control", daemon=True)
        self.path = path
        self.events = events
        self._closing = threading.Event()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead daemon's socket; the state dir's lock proved no daemon is alive
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)  # never a moment when the socket is open to others
        try:
            self.sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self.sock.listen(16)
        self.sock.settimeout(0.2)

    def run(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(2.0)
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                _send(conn, {"ok": False, "error": "not the daemon's owner"})
                return
            body = _read_line(conn)
            if not isinstance(body, dict):
                _send(conn, {"ok": False, "error": "expected one JSON object on one line"})
                return
            request = Request(body)
            self.events.put(("control", request))
            _send(conn, request.wait())
        except (OSError, ValueError):
            return  # a client that went away or sent garbage costs nothing

    def stop(self) -> None:
        self._closing.set()
        self.sock.close()
        self.join(timeout=2)
        with contextlib.suppress(OSError):
            self.path.unlink()


def _read_line(conn: socket.socket) -> Any:
    data = b""
    while b"\n" not in data and len(data) < MAX_REQUEST:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return json.loads(data.split(b"\n", 1)[0] or b"null")


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    conn.sendall(json.dumps(reply).encode() + b"\n")


def ask(path: Path, body: dict[str, Any], timeout: float = 3.0) -> dict[str, Any] | None:
    """Send one request to the daemon at ``path``; ``None`` when no daemon listens there."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            _send(sock, body)
            reply = _read_line(sock)
    except (OSError, ValueError):
        return None
    return reply if isinstance(reply, dict) else None
