"""Owns sending notifications: apprise behind one sender thread, and the journal listener that tells a
run's story (``RunAlerts``).

Sending never slows the decision loop: ``Alerts.tell`` and ``Alerts.send`` only put the notice in a
bounded queue; a thread of its own imports apprise (the daemon stays light where nothing is
configured), reads the log tail and sends, each URL with ``notify.timeout_s`` as its connect and read
timeout. A failed send is journaled (``notify_failed``, the URL with its secrets masked), said once
per URL on the console, and never stops anything. The same fault with the same remedy is told once
per ``notify.rate_limit_s``; the next one says how many were held back.

A URL may name environment variables as ``${NAME}`` (``tgram://${TG_TOKEN}/${TG_CHAT}``), so
secrets stay out of project files; a variable that is not set leaves that URL out, with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..record.journal import Journal
from ..record.textfmt import format_duration
from ..run.policy import ENV_REF, NotifyPolicy
from .notices import Notice, RateLimit, RunStory, log_tail

QUEUE_SIZE = 64
Report = Callable[[dict[str, Any]], object]


def _warn(message: str) -> None:
    print(f"trainsup: warning: {message}", file=sys.stderr, flush=True)


def expand_env(url: str, env: Mapping[str, str]) -> str:
    """``${NAME}`` replaced by the environment's ``NAME``; ``KeyError(NAME)`` when it is not set."""
    return ENV_REF.sub(lambda m: env[m.group(1)], url)


def masked(url: str, plugin: Any = None) -> str:
    """A URL fit for a journal or a console: apprise's own privacy form, else the scheme alone."""
    if plugin is not None:
        with contextlib.suppress(Exception):  # a plugin that cannot print itself: the scheme will do
            return str(plugin.url(privacy=True)).partition("?")[0]  # apprise's defaults are noise here
    return url.partition("://")[0] + "://…"


class Alerts:
    """The notifications of one ``notify:`` section: which kinds it wants, the rate limit, the queue
    and the sender thread (started with the first notice, ended by ``close``)."""

    def __init__(self, policy: NotifyPolicy, env: Mapping[str, str] = os.environ, *,
                 report: Report | None = None, warn: Callable[[str], None] = _warn,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self.report = report  # called from the sender thread with notify_failed's fields
        self.warn = warn
        urls: list[str] = []
        for i, url in enumerate(policy.urls):
            try:
                urls.append(expand_env(url, env))
            except KeyError as exc:
                warn(f"notify.urls[{i}]: ${{{exc.args[0]}}} is not set in the environment; that URL is left out")
        self.urls = tuple(urls)
        self.limit = RateLimit(policy.rate_limit_s, clock)
        self._queue: queue.Queue[Notice | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._deadline: float | None = None  # set at close: what is not sent by then is dropped
        self._warned: set[str] = set()
        self.sent = 0
        self.failed = 0

    def wants(self, kind: str) -> bool:
        return bool(self.urls) and kind in self.policy.on

    def send(self, title: str, body: str = "", *, kind: str = "queue_empty", level: str = "info",
             log: Path | None = None) -> bool:
        """Queue one notification as it is (no ``on:`` check, no rate limit); False if it is dropped."""
        return self._enqueue(Notice(kind, title, body, level, log))

    def tell(self, notice: Notice) -> bool:
        """Queue a run's notice; one with a key goes through the rate limit first."""
        if not self.urls:
            return False
        if notice.key is not None:
            held = self.limit.admit(notice.key)
            if held is None:
                return False
            if held:
                notice = replace(notice, body=f"{notice.body}\n{held} more of the same since the last "
                                 f"notification (told at most once per {format_duration(self.policy.rate_limit_s)})")
        return self._enqueue(notice)

    def _enqueue(self, notice: Notice) -> bool:
        with self._lock:
            if self._closed or not self.urls:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainsup-notify", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(notice)
        except queue.Full:
            self._failed(notice, "", "not sent: too many notifications waiting (the receiver is slow or down)")
            return False
        return True

    def close(self) -> None:
        """Send what is queued (within about ``2 x timeout_s`` a URL), then end the sender thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        budget = 2 * self.policy.timeout_s * max(1, len(self.urls)) + 2
        self._deadline = time.monotonic() + budget
        try:
            self._queue.put(None, timeout=budget)
        except queue.Full:
            pass
        thread.join(budget)
        if thread.is_alive():
            self.warn("a notification was still being sent at the end; it was left behind")

    # --- the sender thread -----------------------------------------------------------------------
    def _run(self) -> None:
        targets = self._targets()
        while True:
            notice = self._queue.get()
            if notice is None:
                return
            if self._deadline is not None and time.monotonic() > self._deadline:
                self._failed(notice, "", "not sent: trainsup was ending and its time to send ran out")
                continue
            body = self._body(notice)
            for url, plugin, sender in targets:
                if sender is None:
                    self._failed(notice, masked(url), plugin or "not a valid apprise URL")
                else:
                    self._send(notice, body, url, plugin, sender)

    def _targets(self) -> list[tuple[str, Any, Any]]:
        """(url, plugin, Apprise) per URL; an unusable one is (url, why, None)."""
        try:
            import apprise
        except ImportError as exc:
            return [(url, f"apprise cannot be imported ({exc})", None) for url in self.urls]
        try:
            asset = apprise.AppriseAsset(service_timeout=0)  # no deadline: no apprise worker pool
        except (AttributeError, TypeError):  # an apprise without that setting sends in this thread anyway
            asset = apprise.AppriseAsset()
        targets: list[tuple[str, Any, Any]] = []
        for url in self.urls:
            plugin = apprise.Apprise.instantiate(url, asset=asset)
            if plugin is None:
                targets.append((url, None, None))
                continue
            for attr in ("socket_connect_timeout", "socket_read_timeout"):
                current = getattr(plugin, attr, None)
                if not isinstance(current, (int, float)) or current <= 0 or current > self.policy.timeout_s:
                    setattr(plugin, attr, self.policy.timeout_s)
            sender = apprise.Apprise(asset=asset)
            sender.add(plugin)
            targets.append((url, plugin, sender))
        return targets

    def _body(self, notice: Notice) -> str:
        tail = log_tail(notice.log, self.policy.tail_lines) if notice.log is not None else []
        if not tail:
            return notice.body
        assert notice.log is not None
        return f"{notice.body}\n\nlast {len(tail)} lines of {notice.log.name}:\n" + "\n".join(tail)

    def _send(self, notice: Notice, body: str, url: str, plugin: Any, sender: Any) -> None:
        import apprise

        try:
            with apprise.LogCapture(level=logging.WARNING) as log:  # type: ignore[no-untyped-call]
                ok = sender.notify(body=body, title=notice.title, notify_type=notice.level,
                                   body_format=apprise.NotifyFormat.TEXT)
            said = [line.split(" - ", 2)[-1] for line in log.getvalue().splitlines() if line.strip()]
        except Exception as exc:  # noqa: BLE001 - a plugin's bug must not end the sender
            ok, said = False, [f"{type(exc).__name__}: {exc}"]
        if ok:
            self.sent += 1
        else:
            self._failed(notice, masked(url, plugin), said[-1] if said else "the service refused it")

    def _failed(self, notice: Notice, where: str, error: str) -> None:
        self.failed += 1
        fields = {"kind": notice.kind, "title": notice.title, "url": where, "error": error}
        if where not in self._warned:
            self._warned.add(where)
            self.warn(f"notification {notice.kind!r}{' to ' + where if where else ''} failed: {error} "
                      "(journal: notify_failed); the run goes on")
        if self.report is not None:
            with contextlib.suppress(Exception):  # reporting a failure must never fail the sender
                self.report(fields)


class RunAlerts:
    """A journal listener: the run's notices (``RunStory``) handed to ``Alerts``; ``notify_*`` records
    (its own) are passed over."""

    def __init__(self, policy: NotifyPolicy, env: Mapping[str, str] = os.environ, *, project: str | None = None,
                 alerts: Alerts | None = None) -> None:
        self.alerts = alerts if alerts is not None else Alerts(policy, env)
        self.story = RunStory(policy.on, project)

    def bind(self, journal: Journal) -> None:
        self.alerts.report = lambda fields: journal.event("notify_failed", **fields)

    def on_event(self, record: dict[str, Any]) -> None:
        if str(record.get("event", "")).startswith("notify_"):
            return
        for notice in self.story.on_event(record):
            self.alerts.tell(notice)

    def on_status(self, snapshot: dict[str, Any]) -> None:
        self.story.on_status(snapshot)

    def close(self) -> None:
        for notice in self.story.flush():
            self.alerts.tell(notice)
        self.alerts.close()
