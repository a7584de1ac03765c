"""Owns the YAML policy: defaults, loading, and validation with file:line errors.

Every key is optional; ``config.example.yaml`` lists them with their defaults. Errors name the file,
the line, the key path, what was expected and what was found, e.g.
``policy.yaml:12: restart.max: expected an integer >= 0, got 'five'``.

``notify:`` and ``metrics:`` are parsed here (the run layer carries them) and acted on by ``service``
(``service.alerts``, ``service.metrics``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..record.textfile import NotTextError, read_text
from ..sensors.gpuwatch import GpuPolicy
from ..sensors.hang import HangPolicy
from ..trainers.base import Settings


class PolicyError(ValueError):
    pass


NOTIFY_EVENTS = ("finished", "gave_up", "fault", "remedy", "hang", "queue_empty")
ENV_REF = re.compile(r"\$\{([^}]*)\}")  # ${NAME} in a notification URL: taken from the environment
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class NotifyPolicy:
    """``notify:``: where to send notifications (apprise URLs) and on which events."""

    urls: tuple[str, ...] = ()  # apprise URLs; ${NAME} is replaced by the environment's NAME when sending
    on: tuple[str, ...] = ("finished", "gave_up", "hang")  # of NOTIFY_EVENTS
    tail_lines: int = 20  # the attempt log's last lines in a run's notification
    timeout_s: float = 10.0  # connect and read timeout of each send
    rate_limit_s: float = 600.0  # the same fault with the same remedy is told once in this long


@dataclass(frozen=True)
class MetricsPolicy:
    """``metrics:``: a Prometheus endpoint and/or a node_exporter textfile (both off by default)."""

    listen: str | None = None  # "HOST:PORT" (normalised; a bare port means 127.0.0.1)
    textfile: str | None = None  # a .prom file, replaced atomically; relative: in the run dir


def parse_listen(value: str, any_port: bool = False) -> tuple[str, int]:
    """``"127.0.0.1:9464"``, ``"[::1]:9464"``, ``"0.0.0.0:9464"`` or a bare ``"9464"`` (loopback);
    ``any_port``: port 0 too (the system picks a free one)."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isdigit() or not (0 if any_port else 1) <= int(port) <= 65535:
        raise ValueError(f"{value!r}")
    return host, int(port)


DEADLINE_SIGNALS = ("USR1", "USR2", "HUP", "ALRM", "URG", "XCPU")  # never TERM/INT (stop) or CONT


@dataclass(frozen=True)
class SlurmPolicy:
    """``slurm:``: what the deadline signal means and what follows it (see ``run.deadline``)."""

    deadline_signal: str = "USR1"  # of DEADLINE_SIGNALS, as in `--signal=B:USR1@300`
    lead_s: float = 300.0  # the signal comes at least this long before the job's end (the @300)
    requeue: bool = True  # inside a Slurm job: `scontrol requeue $SLURM_JOB_ID` after the stop
    requeue_budget: int = 3  # requeues in a row without a new complete state; then give up (exit 3)
    exit_code_after_requeue: int | None = None  # None: 128 + the signal's number (138 for USR1)


EXIT_CODE_NAMES = ("gave_up", "fault", "sigint", "sigterm", "deadline")  # commands.exitcodes: what each is
EXIT_CODES_ENV = "TRAINSUP_EXIT_CODES"  # "native": exit_codes: is not applied (trainsup serve's entries)


@dataclass(frozen=True)
class ExitCodesPolicy:
    """``exit_codes:``: the code ``trainsup run`` exits with in place of its own, per outcome (null: its
    own); for a scheduler with its own convention (``commands.exitcodes.remap`` applies it)."""

    gave_up: int | None = None  # 3: the restart (or requeue) budget is spent
    fault: int | None = None  # 4: stopped on a fault a restart cannot fix
    sigint: int | None = None  # 130: stopped by SIGINT
    sigterm: int | None = None  # 143: stopped by SIGTERM (scancel, a time limit, a pod's deletion)
    deadline: int | None = None  # 138 (128 + slurm.deadline_signal): stopped at the deadline signal

    def given(self) -> dict[str, int]:
        return {name: code for name in EXIT_CODE_NAMES if (code := getattr(self, name)) is not None}


@dataclass(frozen=True)
class Policy:
    restart_max: int = 5
    restart_window_s: float = 3600.0
    min_uptime_s: float = 10.0
    max_quick_exits: int = 3
    backoff_initial_s: float = 2.0
    backoff_max_s: float = 60.0
    backoff_factor: float = 2.0
    stop_grace_s: float = 30.0
    save_every_n_steps: int | None = None  # None: about 10% of the run's steps
    allow_upgrade: bool = True
    pump_wait_s: float = 2.0  # after the child exits, how long its pipes may stay open (orphans)
    on_prompt_change: str = "at_checkpoint"  # at_checkpoint | now | ignore, for trainers that cache prompts
    snapshot_prompts: bool = True  # give each launch a frozen prompt copy (protects cached prompts)
    lease_stale_s: float = 60.0  # a lease not renewed this long is a dead supervisor's (see record.lease)
    debounce_s: float = 0.1  # one editor save raises several events: report a file once quiet this long
    rules: tuple[Any, ...] = field(default_factory=tuple)  # fault rules added by the user
    hang: HangPolicy = field(default_factory=HangPolicy)  # the hang clock's timeouts (see sensors.hang)
    gpu: GpuPolicy = field(default_factory=GpuPolicy)  # sampling and relaunch waits (see sensors.gpuwatch)
    notify: NotifyPolicy = field(default_factory=NotifyPolicy)  # notifications (see service.alerts)
    metrics: MetricsPolicy = field(default_factory=MetricsPolicy)  # Prometheus (see service.metrics)
    slurm: SlurmPolicy = field(default_factory=SlurmPolicy)  # the deadline signal (see run.deadline)
    exit_codes: ExitCodesPolicy = field(default_factory=ExitCodesPolicy)  # trainsup run's codes remapped
    source: str = "<defaults>"

    def trainer_settings(self) -> Settings:
        """The keys a trainer session reads."""
        return Settings(self.save_every_n_steps, self.snapshot_prompts, self.on_prompt_change)


def _int(minimum: int) -> Callable[[Any], int]:
    def conv(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise TypeError(f"an integer >= {minimum}")
        return v
    return conv


def _num(minimum: float) -> Callable[[Any], float]:
    def conv(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < minimum:
            raise TypeError(f"a number >= {minimum}")
        return float(v)
    return conv


def _optional(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def conv(v: Any) -> Any:
        if v is None:
            return None
        try:
            return inner(v)
        except TypeError as exc:
            raise TypeError(f"null or {exc}") from None
    return conv


def _choice(*options: str) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        if v not in options:
            raise TypeError(" | ".join(options))
        return str(v)
    return conv


def _signal_name(v: Any) -> str:
    name = str(v).upper().removeprefix("SIG") if isinstance(v, str) else ""
    if name not in DEADLINE_SIGNALS:
        raise TypeError(f"one of {', '.join(DEADLINE_SIGNALS)}")
    return name


def _exit_code(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 255:
        raise TypeError("an exit code 0..255")
    return v


def _failure_code(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 255:
        raise TypeError("an exit code 1..255 (0 would report a failure as success)")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError("true or false")
    return v


def _url(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise TypeError("a URL")
    for name in ENV_REF.findall(v):
        if not _ENV_NAME.fullmatch(name):
            raise TypeError(f"${{NAME}} with NAME an environment variable's name (not {name!r})")
    return v.strip()


def _list_of(item: Callable[[Any], str], what: str) -> Callable[[Any], tuple[str, ...]]:
    def conv(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list):
            raise TypeError(f"a list of {what}")
        try:
            return tuple(item(x) for x in v)
        except TypeError as exc:
            raise TypeError(f"a list of {what} ({exc})") from None
    return conv


def _event(v: Any) -> str:
    if v not in NOTIFY_EVENTS:
        raise TypeError(f"not {v!r}")
    return str(v)


def _listen(v: Any) -> str | None:
    if v is None:
        return None
    expected = "null, a port or HOST:PORT (port 1-65535)"
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise TypeError(expected)
    try:
        host, port = parse_listen(str(v).strip())
    except ValueError:
        raise TypeError(expected) from None
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _prom_file(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip().endswith(".prom"):
        raise TypeError("null or a path ending in .prom (node_exporter reads only those)")
    return v.strip()


# section -> key -> (Policy field, converter)
_SCHEMA: dict[str, dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "restart": {
        "max": ("restart_max", _int(0)),
        "window_s": ("restart_window_s", _num(1)),
        "min_uptime_s": ("min_uptime_s", _num(0)),
        "max_quick_exits": ("max_quick_exits", _int(1)),
    },
    "backoff": {
        "initial_s": ("backoff_initial_s", _num(0)),
        "max_s": ("backoff_max_s", _num(0)),
        "factor": ("backoff_factor", _num(1)),
    },
    "stop": {"grace_s": ("stop_grace_s", _num(0)), "pump_wait_s": ("pump_wait_s", _num(0))},
    "lease": {"stale_s": ("lease_stale_s", _num(1))},
    "save": {"every_n_steps": ("save_every_n_steps", _optional(_int(1)))},
    "environment": {"allow_upgrade": ("allow_upgrade", _bool)},
    "live": {
        "on_prompt_change": ("on_prompt_change", _choice("at_checkpoint", "now", "ignore")),
        "debounce_s": ("debounce_s", _num(0)),
        "snapshot_prompts": ("snapshot_prompts", _bool),
    },
    # "hang.X" names a field of HangPolicy, "gpu.X" one of GpuPolicy
    "hang": {
        "startup_timeout_s": ("hang.startup_timeout_s", _num(1)),
        "min_timeout_s": ("hang.min_timeout_s", _num(1)),
        "step_factor": ("hang.step_factor", _num(1)),
        "phase_timeout_s": ("hang.phase_timeout_s", _num(1)),
        "timeout_s": ("hang.timeout_s", _optional(_num(1))),
    },
    "gpu": {
        "poll_s": ("gpu.poll_s", _num(0.05)),
        "reclaim_tolerance_mib": ("gpu.reclaim_tolerance_mib", _num(0)),
        "reclaim_timeout_s": ("gpu.reclaim_timeout_s", _num(0)),
        "foreign_warn_mib": ("gpu.foreign_warn_mib", _num(0)),
        "on_foreign": ("gpu.on_foreign", _choice("warn", "wait")),
    },
    "notify": {
        "urls": ("notify.urls", _list_of(_url, "apprise URLs")),
        "on": ("notify.on", _list_of(_event, " | ".join(NOTIFY_EVENTS))),
        "tail_lines": ("notify.tail_lines", _int(0)),
        "timeout_s": ("notify.timeout_s", _num(1)),
        "rate_limit_s": ("notify.rate_limit_s", _num(0)),
    },
    "metrics": {"listen": ("metrics.listen", _listen), "textfile": ("metrics.textfile", _prom_file)},
    "slurm": {
        "deadline_signal": ("slurm.deadline_signal", _signal_name),
        "lead_s": ("slurm.lead_s", _num(0)),
        "requeue": ("slurm.requeue", _bool),
        "requeue_budget": ("slurm.requeue_budget", _int(0)),
        "exit_code_after_requeue": ("slurm.exit_code_after_requeue", _optional(_exit_code)),
    },
    "exit_codes": {
        "gave_up": ("exit_codes.gave_up", _optional(_failure_code)),
        "fault": ("exit_codes.fault", _optional(_failure_code)),
        "sigint": ("exit_codes.sigint", _optional(_exit_code)),
        "sigterm": ("exit_codes.sigterm", _optional(_exit_code)),
        "deadline": ("exit_codes.deadline", _optional(_exit_code)),
    },
}
_TOP_LEVEL = set(_SCHEMA) | {"rules"}


def load_policy(path: Path | None, allow: frozenset[str] = frozenset()) -> Policy:
    if path is None:
        return Policy()
    try:
        text = read_text(path, "policy file")
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read the policy ({exc.strerror or exc})") from None
    except NotTextError as exc:
        raise PolicyError(str(exc)) from None
    return parse_policy(text, str(path), allow)


def parse_policy(text: str, source: str, allow: frozenset[str] = frozenset()) -> Policy:
    """The policy in ``text``; top-level keys in ``allow`` belong to someone else (a project file's
    ``command:`` and friends) and are passed over."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise PolicyError(f"{where}: malformed YAML: {getattr(exc, 'problem', None) or exc}") from None
    if root is None:
        return Policy(source=source)
    if not isinstance(root, yaml.MappingNode):
        raise PolicyError(f"{source}:{root.start_mark.line + 1}: expected a mapping of sections at the top")
    values: dict[str, Any] = {}
    lines: dict[str, int] = {}  # a policy field -> the line of its key
    for key_node, value_node in root.value:
        section = key_node.value
        line = key_node.start_mark.line + 1
        if section in allow:
            continue
        if section not in _TOP_LEVEL:
            raise PolicyError(f"{source}:{line}: unknown section {section!r}; expected one of "
                              f"{', '.join(sorted(_TOP_LEVEL | allow))}")
        if section == "rules":
            values["rules"] = _rules(value_node, source)
            continue
        if not isinstance(value_node, yaml.MappingNode):
            raise PolicyError(f"{source}:{line}: {section}: expected a mapping")
        for k_node, v_node in value_node.value:
            key = k_node.value
            kline = k_node.start_mark.line + 1
            spec = _SCHEMA[section].get(key)
            if spec is None:
                raise PolicyError(f"{source}:{kline}: {section}.{key}: unknown key; expected one of "
                                  f"{', '.join(sorted(_SCHEMA[section]))}")
            raw = yaml.safe_load(yaml.serialize(v_node))
            name, conv = spec
            try:
                values[name] = conv(raw)
            except TypeError as exc:
                raise PolicyError(f"{source}:{kline}: {section}.{key}: expected {exc}, got {raw!r}") from None
            lines[name] = kline
    if values.get("exit_codes.deadline") is not None and values.get("slurm.exit_code_after_requeue") is not None:
        raise PolicyError(f"{source}:{lines['exit_codes.deadline']}: exit_codes.deadline: expected null while "
                          f"slurm.exit_code_after_requeue (line {lines['slurm.exit_code_after_requeue']}) sets "
                          f"the same code, got {values['exit_codes.deadline']!r}; give one of them")
    nested = {section: {k.removeprefix(f"{section}."): values.pop(k) for k in list(values)
                        if k.startswith(f"{section}.")}
              for section in ("hang", "gpu", "notify", "metrics", "slurm", "exit_codes")}
    return Policy(source=source, hang=HangPolicy(**nested["hang"]), gpu=GpuPolicy(**nested["gpu"]),
                  notify=NotifyPolicy(**nested["notify"]), metrics=MetricsPolicy(**nested["metrics"]),
                  slurm=SlurmPolicy(**nested["slurm"]), exit_codes=ExitCodesPolicy(**nested["exit_codes"]), **values)


def _rules(node: yaml.Node, source: str) -> tuple[Any, ...]:
    from ..faults.scanner import load_user_rules

    data = yaml.safe_load(yaml.serialize(node))
    try:
        return tuple(load_user_rules(data, f"{source}:{node.start_mark.line + 1}"))
    except ValueError as exc:
        raise PolicyError(str(exc)) from None
