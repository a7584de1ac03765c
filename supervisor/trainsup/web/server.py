"""Owns serving the page: the listen address, the token line printed at start, and waitress.

``trainsup web`` serves in the foreground until SIGTERM or SIGINT; ``trainsup serve --web ADDR``
serves from a thread of its own beside the queue's decision loop, which never waits on it. Either
way the page runs in a process that only reads the run dirs: a supervisor never waits for it.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from waitress import wasyncore
from waitress.server import create_server

from ..run.policy import parse_listen
from ..service.queuestore import QueueStore, state_dir
from .app import create_app
from .auth import Guard, TokenError, is_loopback, load_token
from .runs import Catalog

THREADS = 8  # a few open tabs, each asking for its live part every second
LOOP_S = 0.2  # how soon the serving loop sees a stop


class WebError(Exception):
    """The page cannot be served (a bad address, a port in use, a token that cannot be kept)."""


def parse_address(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT`` or a bare ``PORT`` (loopback); port 0 takes any free one."""
    try:
        return parse_listen(value.strip(), any_port=True)
    except ValueError:
        raise WebError(f"--listen: expected HOST:PORT (127.0.0.1:8470), [::1]:PORT or PORT, got {value!r}") from None


class WebServer:
    """The page on one address; ``serve_forever`` or ``start`` (a thread), then ``close``."""

    def __init__(self, listen: str, state: Path, named: Sequence[Path], env: Mapping[str, str]) -> None:
        host, port = parse_address(listen)
        try:
            token, self.token_path = load_token(state)
        except TokenError as exc:
            raise WebError(str(exc)) from None
        store = QueueStore(state)
        catalog = Catalog(env, store, named)
        guard = Guard(token, host, port)
        app = create_app(catalog, guard, store, env)
        try:
            self._server: Any = create_server(app, host=host, port=port, threads=THREADS,
                                              ident="trainsup", expose_tracebacks=False)
        except OSError as exc:
            raise WebError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
        bound_host, bound_port = self._server.effective_host, self._server.effective_port
        shown = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
        self.url = f"http://{shown}:{bound_port}/"
        self.token = token
        self.loopback = is_loopback(host)
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def banner(self) -> str:
        who = "actions need the token" if self.loopback else "every page needs the token"
        return (f"trainsup web: serving {self.url} (token: {self.token}; kept in {self.token_path}; {who})")

    def serve_forever(self) -> None:
        """Serve until ``close``: waitress's loop, a pass at a time, so that the end (every socket and
        worker closed) happens here, in the loop's own thread, even with browsers still connected."""
        server = self._server
        sockets = getattr(server, "map", None) or server._map
        try:
            while not self._stopping.is_set():
                wasyncore.loop(timeout=LOOP_S, map=sockets, use_poll=True, count=1)
        finally:
            server.task_dispatcher.shutdown(cancel_pending=True, timeout=5)
            wasyncore.close_all(sockets)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, name="trainsup-web", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Ask the loop to end (safe from a signal handler); a thread started by ``start`` is joined."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def beside(listen: str, state: Path, env: Mapping[str, str], main: Callable[[], int]) -> int:
    """``trainsup serve --web``: the page from a thread while ``main`` (the queue's loop) runs; 2 when
    the page cannot be served (nothing is started then)."""
    try:
        server = WebServer(listen, state, (), env)
    except WebError as exc:
        print(f"trainsup serve: error: --web: {exc}", file=sys.stderr)
        return 2
    print(server.banner(), file=sys.stderr, flush=True)
    server.start()
    try:
        return main()
    finally:
        server.close()


def run_web(listen: str, state_arg: Path | None, projects: Path | None, named: Sequence[Path],
            env: Mapping[str, str]) -> int:
    """``trainsup web``: 0 stopped by SIGTERM/SIGINT; 2 the page cannot be served."""
    import logging
    import signal

    state = state_dir(state_arg, env)
    if projects is not None:
        env = {**env, "TRAINSUP_PROJECTS": str(projects)}

    # waitress warns on stderr whenever requests wait for a free thread ("Task queue depth"): a busy
    # moment of a page that refreshes itself, not something for the user to act on.
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)

    try:
        server = WebServer(listen, state, named, env)
    except WebError as exc:
        print(f"trainsup web: error: {exc}", file=sys.stderr)
        return 2
    print(server.banner(), file=sys.stderr, flush=True)
    if not server.loopback:
        print("trainsup web: note: listening beyond loopback: the page is plain HTTP, so put it behind TLS "
              "or reach it through `ssh -L` (see docs/guides/web.md)", file=sys.stderr, flush=True)

    def stop(_signum: int, _frame: object) -> None:
        server.close()  # only sets the flag: the loop ends within LOOP_S and closes everything itself

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.serve_forever()
    print("trainsup web: stopped", file=sys.stderr, flush=True)
    return 0
