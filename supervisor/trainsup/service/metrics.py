"""Owns trainsup's Prometheus metrics: a run's journal folded into values, and their export.

``RunMetrics`` folds journal records and status snapshots; the same folding serves a live run
(``MetricsListener``, a journal listener) and a process that only reads run dirs (``RunDirMetrics``,
for ``trainsup serve``). ``TrainsupCollector`` exports any number of runs, one ``project`` label
each, merging the samples of a family across runs (one HELP/TYPE a family). Counters count since the
run's supervisor started (its ``run_start``); a new supervisor of the same run dir starts them anew,
which Prometheus reads as a counter reset.

Export: ``metrics.listen`` (an HTTP endpoint, ``/metrics``, on its own private registry) and
``metrics.textfile`` (a ``.prom`` file for node_exporter's textfile collector, written from a thread
of its own at most once a second and replaced atomically, plus once at the end). An address already
in use, or a textfile that cannot be written, is one warning line; the run goes on without it.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..record.journalkinds import ATTEMPT_START, FAULT, REMEDY, RUN_START
from ..record.textfmt import eta_seconds
from ..run.policy import MetricsPolicy, parse_listen
from ..run.runstate import RunState

STATES = tuple(s.value for s in RunState)
MIB = 1024 * 1024
TEXTFILE_INTERVAL_S = 1.0


def _warn(message: str) -> None:
    print(f"trainsup: warning: {message}", file=sys.stderr, flush=True)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _bytes(mib: Any) -> float | None:
    value = _number(mib)
    return None if value is None else value * MIB


@dataclass
class RunMetrics:
    """What one run's journal says, as metric values; ``None`` is unknown (no sample, never 0)."""

    project: str | None = None
    state: str | None = None
    step: float | None = None
    total: float | None = None
    loss: float | None = None
    rate: float | None = None  # steps per second
    attempts: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    remedies: dict[tuple[str, str], int] = field(default_factory=dict)
    hangs: int = 0
    gpus: tuple[tuple[str, float | None, float | None, float | None], ...] = ()  # index, used, trainer, total

    def apply_event(self, record: Mapping[str, Any]) -> None:
        kind = record.get("event")
        if kind == RUN_START:  # a new supervisor: its counters start at 0
            self.attempts, self.faults, self.remedies, self.hangs = 0, {}, {}, 0
            self.project = self.project or record.get("project")
        elif kind == ATTEMPT_START:
            self.attempts += 1
        elif kind == FAULT:
            cls = str(record.get("class"))
            self.faults[cls] = self.faults.get(cls, 0) + 1
            self.hangs += cls == "hang"
        elif kind == REMEDY:
            key = (str(record.get("class")), str(record.get("rung")))
            self.remedies[key] = self.remedies.get(key, 0) + 1

    def apply_status(self, snapshot: Mapping[str, Any]) -> None:
        self.state = snapshot.get("state") if isinstance(snapshot.get("state"), str) else self.state
        self.step, self.total = _number(snapshot.get("step")), _number(snapshot.get("total"))
        self.loss, self.rate = _number(snapshot.get("loss")), _number(snapshot.get("rate"))
        gpus = snapshot.get("gpu")  # null without a driver; MiB values, null where NVML cannot tell
        self.gpus = tuple((str(g.get("index")), _bytes(g.get("used_mib")), _bytes(g.get("trainer_mib")),
                           _bytes(g.get("total_mib")))
                          for g in (gpus if isinstance(gpus, list) else []) if isinstance(g, dict))

    def copy(self) -> RunMetrics:
        return replace(self, faults=dict(self.faults), remedies=dict(self.remedies))

    def families(self, project: str | None = None) -> list[Metric]:
        """This run's metric families, every sample labelled ``project``."""
        p = project or self.project or ""
        out: list[Metric] = []

        def gauge(name: str, doc: str, value: float | None, unit: str = "") -> None:
            family = GaugeMetricFamily(name, doc, labels=["project"], unit=unit)
            if value is not None:
                family.add_metric([p], value)
            out.append(family)

        gauge("trainsup_run_step", "Absolute optimizer step the run has reached.", self.step)
        gauge("trainsup_run_total_steps", "Steps the run trains in all (--max_train_steps).", self.total)
        gauge("trainsup_run_loss", "The trainer's last reported average loss (no sample when NaN).", self.loss)
        running = self.state == RunState.RUNNING.value
        gauge("trainsup_run_steps_per_second", "Training speed while the trainer runs.",
              self.rate if running else None)
        eta = eta_seconds(self.step, self.total, self.rate) if running else None
        gauge("trainsup_run_eta_seconds", "Time left at the current speed, while the trainer runs.", eta)
        states = GaugeMetricFamily("trainsup_run_state", "1 for the run's state, 0 for every other state.",
                                   labels=["project", "state"])
        for state in STATES + ((self.state,) if self.state and self.state not in STATES else ()):
            states.add_metric([p, state], 1.0 if state == self.state else 0.0)
        out.append(states)
        for name, doc, value in (("trainsup_attempts", "Trainer launches by this supervisor.", self.attempts),
                                 ("trainsup_hangs", "Hangs found (no progress while the trainer lived).",
                                  self.hangs)):
            counter = CounterMetricFamily(name, doc, labels=["project"])
            counter.add_metric([p], value)
            out.append(counter)
        faults = CounterMetricFamily("trainsup_faults", "Attempts that ended on a fault, by fault class.",
                                     labels=["project", "class"])
        for cls, n in sorted(self.faults.items()):
            faults.add_metric([p, cls], n)
        remedies = CounterMetricFamily("trainsup_remedies", "Remedies applied, by fault class and ladder rung.",
                                       labels=["project", "class", "rung"])
        for (cls, rung), n in sorted(self.remedies.items()):
            remedies.add_metric([p, cls, rung], n)
        out += [faults, remedies]
        for i, (name, doc) in enumerate((
                ("trainsup_gpu_memory_used_bytes", "Memory used on the GPU, by every program."),
                ("trainsup_gpu_memory_trainer_bytes", "Memory the trainer's processes hold on the GPU."),
                ("trainsup_gpu_memory_total_bytes", "The GPU's memory."))):
            family = GaugeMetricFamily(name, doc, labels=["project", "gpu"])
            for index, *values in self.gpus:
                reading = values[i]
                if reading is not None:
                    family.add_metric([p, index], reading)
            out.append(family)
        return out


def merge_families(families: Iterable[Metric]) -> list[Metric]:
    """One family per name (the first one's HELP and TYPE) holding every run's samples."""
    merged: dict[str, Metric] = {}
    for family in families:
        into = merged.get(family.name)
        if into is None:
            into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
        into.samples.extend(family.samples)
    return list(merged.values())


class TrainsupCollector(Collector):
    """A prometheus_client collector over the runs ``runs()`` returns, plus ``extra()``'s families
    (``trainsup serve`` adds its queue's)."""

    def __init__(self, runs: Callable[[], Iterable[RunMetrics]],
                 extra: Callable[[], Iterable[Metric]] | None = None) -> None:
        self.runs, self.extra = runs, extra

    def collect(self) -> Iterable[Metric]:
        families = [f for run in self.runs() for f in run.families()]
        if self.extra is not None:
            families.extend(self.extra())
        return merge_families(families)


def registry_for(runs: Callable[[], Iterable[RunMetrics]],
                 extra: Callable[[], Iterable[Metric]] | None = None) -> CollectorRegistry:
    """A private registry (no process or platform metrics) holding only trainsup's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TrainsupCollector(runs, extra))
    return registry


class Endpoint:
    """A running ``/metrics`` HTTP server; ``close`` stops it, frees the port and ends its thread."""

    def __init__(self, server: Any, thread: threading.Thread, address: str) -> None:
        self.server, self.thread, self.address = server, thread, address
        self.port: int = server.server_port

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def start_listener(address: str, registry: CollectorRegistry) -> Endpoint:
    """Serve ``registry`` at ``address`` (``"127.0.0.1:9464"``; a bare port is loopback). Raises
    ``OSError`` when it cannot listen, ``ValueError`` for a malformed address."""
    host, port = parse_listen(address)
    server, thread = start_http_server(port, host, registry)
    return Endpoint(server, thread, address)


class TextfileWriter:
    """Writes ``registry`` to a ``.prom`` file from its own thread: at most once per ``interval_s`` after
    ``touch``, and once more at ``close``. Each write replaces the file atomically."""

    def __init__(self, path: Path, registry: CollectorRegistry, warn: Callable[[str], None] = _warn,
                 interval_s: float = TEXTFILE_INTERVAL_S) -> None:
        self.path, self.registry, self.warn, self.interval_s = path, registry, warn, interval_s
        self.writes = 0
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failed = False

    def touch(self) -> None:
        """The values changed: write soon."""
        with self._lock:
            if self._stop.is_set():
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trainsup-textfile", daemon=True)
                self._thread.start()
        self._dirty.set()

    def write(self) -> bool:
        try:
            write_to_textfile(str(self.path), self.registry)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                self.warn(f"metrics.textfile: cannot write {self.path} ({exc.strerror or exc}); "
                          "the run goes on without it")
            return False
        self.writes += 1
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                return
            self._dirty.clear()
            self.write()
            self._stop.wait(self.interval_s)  # the throttle; close wakes it

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            thread = self._thread
        self._dirty.set()
        if thread is not None:
            thread.join(10)
        self.write()


class MetricsListener:
    """A journal listener: the live run's ``RunMetrics``, served at ``metrics.listen`` and/or written to
    ``metrics.textfile`` (a relative path is taken from the run dir). Both start at the ``run_start``."""

    def __init__(self, policy: MetricsPolicy, *, project: str | None = None,
                 warn: Callable[[str], None] = _warn) -> None:
        self.policy, self.warn = policy, warn
        self.metrics = RunMetrics(project)
        self.registry = registry_for(lambda: [self.current()])
        self.endpoint: Endpoint | None = None
        self.textfile: TextfileWriter | None = None
        self._lock = threading.Lock()
        self._started = self._closed = False

    def current(self) -> RunMetrics:
        with self._lock:
            return self.metrics.copy()

    def on_event(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.metrics.apply_event(record)
        if record.get("event") == RUN_START and not self._started:
            self._start(Path(record["run_dir"]) if record.get("run_dir") else Path.cwd())
        if self.textfile is not None:
            self.textfile.touch()

    def on_status(self, snapshot: dict[str, Any]) -> None:
        with self._lock:
            self.metrics.apply_status(snapshot)
        if self.textfile is not None:
            self.textfile.touch()

    def _start(self, run_dir: Path) -> None:
        self._started = True
        if self._closed:
            return
        if self.policy.listen is not None:
            try:
                self.endpoint = start_listener(self.policy.listen, self.registry)
            except (OSError, ValueError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                self.warn(f"metrics.listen {self.policy.listen}: cannot listen ({why}); "
                          "the run goes on without the endpoint")
        if self.policy.textfile is not None:
            self.textfile = TextfileWriter(run_dir / Path(self.policy.textfile).expanduser(), self.registry,
                                           self.warn)

    def close(self) -> None:
        self._closed = True
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        if self.textfile is not None:
            self.textfile.close()  # the final values: the run's end state


class RunDirMetrics:
    """A run dir's metrics read from its files, for a process that is not its supervisor: the new whole
    lines of ``events.jsonl`` since the last call (it remembers the byte offset; a shorter file is read
    anew) and ``status.json``, on every ``collect``. The ``project`` label: the one given, else the
    journal's, else the run dir's name (its parent's for ``OUTPUT_DIR/.trainsup``). Thread-safe."""

    def __init__(self, run_dir: Path, project: str | None = None) -> None:
        self.run_dir = run_dir
        self.project = project
        self.metrics = RunMetrics(project)
        self.offset = 0
        self._lock = threading.Lock()

    def collect(self) -> RunMetrics:
        with self._lock:
            self._read_events()
            try:
                status = json.loads((self.run_dir / "status.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                status = None  # none yet, or unreadable: the values stay as last read
            if isinstance(status, dict):
                self.metrics.apply_status(status)
            metrics = self.metrics.copy()
        if not metrics.project:  # a journal older than run_start's project: the run dir names it
            d = self.run_dir
            metrics.project = d.parent.name if d.name == ".trainsup" else d.name
        return metrics

    def _read_events(self) -> None:
        path = self.run_dir / "events.jsonl"
        try:
            with open(path, "rb") as fh:
                size = fh.seek(0, 2)
                if size < self.offset:  # replaced or truncated: fold it from the start
                    self.metrics, self.offset = RunMetrics(self.project), 0
                fh.seek(self.offset)
                data = fh.read(size - self.offset)
        except OSError:
            return
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                self.metrics.apply_event(record)
        self.offset += end
