"""Owns ``trainsup doctor``: a preflight of a training command, with the fix for every finding.

What needs no knowledge of the trainer is here: choosing the adapter (``open_run``, the command as
given), the command's launcher on PATH, the trainer's interpreter (``TrainerRun.python``) and its
versions of torch and the adapter's ``doctor_packages`` (asked in a subprocess), the free space in
the output dir against a saved state's size (``TrainerRun.state_size``; fewer than 3 states' room
is a warning), the GPUs (NVML), and the report: text or JSON, exit code 2, 1 or 0 by the worst
finding (blocker: the run would fail; warning: it would run, but not as meant; information).
Everything about the trainer's own flags and files is the adapter's (``TrainerRun.doctor``), given
what was found here (``DoctorFacts``). The bundled demo scripts' exact flags are read here from
their argument parser (no torch is imported): the trainers never import the demo.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..record.textfmt import format_size
from ..run.project import Project
from ..sensors import gpu
from ..sensors.gpuwatch import visible_devices
from ..trainers.base import DoctorFacts, Finding, Setup, Severity, TrainerRun, UsageError
from ..trainers.cmdline import TrainerCommand, find_script
from ..trainers.interpreter import Probe, probe_versions
from ..trainers.registry import open_run

__all__ = ["Report", "blocker_lines", "doctor", "doctor_project", "format_text", "run_doctor"]

GIB = 1 << 30
STATES_WANTED = 3
_BUSY_BYTES = GIB  # other processes holding at least this much of a GPU are worth a warning
_ORDER = {"blocker": 0, "warning": 1, "info": 2}


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    python: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        severities = {f.severity for f in self.findings}
        return 2 if "blocker" in severities else 1 if "warning" in severities else 0

    def as_json(self) -> dict[str, object]:
        return {"findings": [{"severity": f.severity, "id": f.id, "message": f.message, "fix": f.fix or None}
                             for f in self.findings],
                "python": self.python, "versions": self.versions, "exit_code": self.exit_code}


def _demo_flags(argv: list[str]) -> frozenset[str] | None:
    """The exact flags of the bundled demo scripts (their argparse; no torch is imported)."""
    try:
        command = TrainerCommand.parse(list(argv))
        token = command.launcher[find_script(command.launcher)].replace("\\", "/")
    except ValueError:
        return None
    if "trainsup.demo." not in token and "trainsup/demo/" not in token:
        return None
    from ..demo.cli import build_parser

    parser = build_parser(flux=command.script == "flux_train_network")
    return frozenset(o[2:] for a in parser._actions for o in a.option_strings if o.startswith("--"))


def _interpreter(run: TrainerRun, argv: list[str], env: Mapping[str, str],
                 probe: Callable[..., Probe]) -> tuple[str | None, dict[str, str | None], list[Finding]]:
    """The trainer's interpreter, its package versions, and what was found of them. Not being able
    to tell or ask it is a warning only where the adapter's checks need its packages."""
    first = argv[0]
    found = shutil.which(first, path=env.get("PATH")) if os.sep not in first else first
    if found is None or not os.path.exists(found):
        return None, {}, [Finding("blocker", "launcher_not_found", f"{first}: not found"
                                  + ("" if os.sep in first else " on PATH"),
                                  "activate the trainer's environment, or give the full path")]
    severity: Severity = "warning" if run.doctor_packages else "info"
    python = run.python(env)
    if python is None:
        return None, {}, [Finding(severity, "python_unknown", f"cannot tell which Python {first} runs "
                                  "(it is no python, nor a script whose #! line names one): its "
                                  "packages are not checked",
                                  "launch the script with the venv's python explicitly")]
    result = probe(python, packages=tuple(dict.fromkeys(("torch", *run.doctor_packages))), env=env)
    if result.error is not None:
        return python, {}, [Finding(severity, "python_probe_failed", result.error,
                                    "check that this interpreter starts")]
    return python, result.versions, [Finding("info", "python", f"{python}: " + ", ".join(
        f"{k} {v or 'missing'}" for k, v in result.versions.items()))]


def _disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def _disk(run: TrainerRun, disk_free: Callable[[Path], int]) -> list[Finding]:
    out_dir = run.output_dir
    if out_dir is None:
        return []
    existing = out_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK):
        return [Finding("blocker", "output_not_writable", f"output dir {out_dir}: {existing} is not writable",
                        "choose a directory you can write to")]
    free = disk_free(existing)
    room = f"{format_size(free)} free in {existing}"
    estimate = run.state_size()
    if estimate is None:
        return [Finding("info", "disk", room)]
    state, how = estimate
    room += f"; a saved state is about {format_size(state)} ({how})"
    if free < STATES_WANTED * state:
        return [Finding("warning", "disk_space", f"{room}: fewer than {STATES_WANTED} states fit",
                        "free space or put the output dir on a larger disk (trainsup never deletes checkpoints)")]
    return [Finding("info", "disk", room)]


def _gpus(make_probe: Callable[[], gpu.GpuProbe], env: Mapping[str, str]) -> list[Finding]:
    probe = make_probe()
    try:
        if not probe.available:
            return [Finding("info", "gpu", f"GPU memory not checked: {probe.reason}")]
        try:
            devices = probe.devices()
        except Exception as exc:  # noqa: BLE001 - any NVML failure: the memory is unknown
            return [Finding("info", "gpu", f"GPU memory unknown: NVML failed ({exc})")]
    finally:
        probe.close()
    devices = visible_devices(devices, env.get("CUDA_VISIBLE_DEVICES"))
    if not devices:
        return [Finding("info", "gpu", f"no GPU visible to the trainer ({probe.reason})")]
    out = []
    for d in devices:
        memory = (f"{format_size(d.free_bytes)} free of {format_size(d.total_bytes)}"
                  if d.free_bytes is not None and d.total_bytes is not None else "memory unknown")
        out.append(Finding("info", "gpu", f"GPU {d.index} {d.name}: {memory}"))
        if d.processes is None:
            out.append(Finding("info", "gpu", f"GPU {d.index}: the processes holding its memory are unknown"))
            continue
        if not d.processes:
            continue
        known = sum(p.used_bytes for p in d.processes if p.used_bytes is not None)
        held = known if known else (d.used_bytes or 0)  # per-process figures hidden: the device's own
        if held >= _BUSY_BYTES:
            who = ", ".join(f"pid {p.pid} ({p.name or '?'}) "
                            f"{format_size(p.used_bytes) if p.used_bytes is not None else 'unknown'}"
                            for p in d.processes[:5])
            out.append(Finding("warning", "gpu_busy", f"GPU {d.index}: {len(d.processes)} other process(es) hold "
                               f"{format_size(held)}: {who}",
                               "stop them, or pick a free GPU with CUDA_VISIBLE_DEVICES"))
    return out


def doctor(argv: list[str], cwd: Path, env: Mapping[str, str], *,
           gpu_probe: Callable[[], gpu.GpuProbe] = gpu.probe,
           probe: Callable[..., Probe] = probe_versions,
           disk_free: Callable[[Path], int] = _disk_free,
           trainer: str | Mapping[str, Any] | None = None) -> Report:
    """Every finding for this command, as the trainer would be started from ``cwd`` with ``env``
    (``trainer``: a project's adapter name or ``trainer:`` section)."""
    try:
        run = open_run(Setup(tuple(argv), cwd, as_given=True), trainer)
    except UsageError as exc:
        return Report([Finding("blocker", "command", str(exc), "give the full training command after --")])
    python, versions, findings = _interpreter(run, list(argv), env, probe)
    run.doctor_facts = DoctorFacts(python if versions else None, versions, _demo_flags(list(argv)))
    findings += run.doctor(env)
    findings += _disk(run, disk_free)
    findings += _gpus(gpu_probe, env)
    findings.sort(key=lambda f: _ORDER[f.severity])
    return Report(findings, python, versions)


def format_text(report: Report) -> str:
    lines = []
    for f in report.findings:
        if f.severity == "info":
            lines.append(f"INFO {f.id}: {f.message}")
        else:
            lines.append(f"{f.severity.upper()} {f.id}: {f.message} — fix: {f.fix}")
    counts = [sum(f.severity == s for f in report.findings) for s in ("blocker", "warning")]
    lines.append(f"doctor: {counts[0]} blocker(s), {counts[1]} warning(s)")
    return "\n".join(lines)


def doctor_project(project: Project, env: Mapping[str, str], **seams: Any) -> Report:
    """The findings for a project file's command, as ``trainsup run --project`` would start it: from
    its ``cwd``, with its environment, through its adapter."""
    return doctor(list(project.command), project.cwd, project.child_env(env), trainer=project.trainer, **seams)


def blocker_lines(report: Report) -> list[str]:
    """Each blocker as one line: its message (which names the flag and the file) and the fix."""
    return [f"{f.message} (fix: {f.fix})" if f.fix else f.message for f in report.findings if f.severity == "blocker"]


def run_doctor(argv: list[str], *, as_json: bool, cwd: Path, env: Mapping[str, str], out: TextIO,
               project: Project | None = None) -> int:
    """The verb: 0 no findings, 1 warnings only, 2 blockers."""
    report = doctor_project(project, env) if project is not None else doctor(argv, cwd, env)
    print(json.dumps(report.as_json(), ensure_ascii=False) if as_json else format_text(report), file=out)
    return report.exit_code
