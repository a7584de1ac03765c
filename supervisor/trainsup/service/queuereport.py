"""Owns what ``trainsup serve`` tells beyond its own files: the ``queue_empty`` notification and one
metrics endpoint (and/or textfile) for every entry, from ``serve --policy FILE``'s ``notify:`` and
``metrics:`` sections.

The daemon never joins its runs' processes: each entry's values are folded from its run dir's
journal (``RunDirMetrics``, read incrementally at each scrape), labelled with its project, plus
``trainsup_queue_entries{state}``. Of several entries of one project only the newest that ran is
exported, so a label set never appears twice. Each run's own ``notify:``/``metrics:`` sections still
apply inside its supervisor (its faults, its end); the daemon's section adds what only the queue
knows.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric

from ..record.journal import Journal
from ..run.policy import Policy
from .alerts import Alerts
from .metrics import Endpoint, RunDirMetrics, RunMetrics, TextfileWriter, registry_for, start_listener
from .queuestore import STATES, Entry, QueueStore, counts


class QueueReporting:
    def __init__(self, policy: Policy, store: QueueStore, journal: Journal, warn: Callable[[str], None],
                 env: Mapping[str, str] = os.environ) -> None:
        self.store, self.warn = store, warn
        self.alerts: Alerts | None = None
        if policy.notify.urls:
            self.alerts = Alerts(policy.notify, env, warn=warn,
                                 report=lambda fields: journal.event("notify_failed", **fields))
        self._readers: dict[str, RunDirMetrics] = {}
        self.endpoint: Endpoint | None = None
        self.textfile: TextfileWriter | None = None
        metrics = policy.metrics
        if metrics.listen is None and metrics.textfile is None:
            return
        registry = registry_for(self._runs, self._queue_families)
        if metrics.listen is not None:
            try:
                self.endpoint = start_listener(metrics.listen, registry)
            except (OSError, ValueError) as exc:
                warn(f"metrics.listen: cannot listen on {metrics.listen} ({exc}); serving goes on without it")
        if metrics.textfile is not None:
            path = Path(metrics.textfile)
            self.textfile = TextfileWriter(path if path.is_absolute() else store.root / path, registry, warn)

    def _runs(self) -> Iterable[RunMetrics]:
        newest: dict[str, Entry] = {}
        for entry in self.store.entries():
            if entry.started is not None and (entry.project not in newest or entry.seq > newest[entry.project].seq):
                newest[entry.project] = entry
        runs = []
        for entry in newest.values():
            reader = self._readers.get(entry.id)
            if reader is None:
                reader = self._readers[entry.id] = RunDirMetrics(Path(entry.run_dir), entry.project)
            runs.append(reader.collect())
        return runs

    def _queue_families(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("trainsup_queue_entries", "Entries of the trainsup serve queue, by state",
                                   labels=["state"])
        n = counts(self.store.entries())
        for state in STATES:
            family.add_metric([state], n[state])
        return [family]

    def published(self) -> None:
        """The queue changed or a tick passed: the textfile is written again soon (throttled)."""
        if self.textfile is not None:
            self.textfile.touch()

    def queue_empty(self, n: Mapping[str, int], text: str) -> None:
        if self.alerts is not None and self.alerts.wants("queue_empty"):
            self.alerts.send("trainsup: the queue is empty", text, kind="queue_empty",
                             level="warning" if n.get("failed") else "success")

    def close(self) -> None:
        for part in (self.alerts, self.endpoint, self.textfile):
            if part is not None:
                part.close()
