"""Owns ``trainsup doctor``: a preflight of a kohya command line, with the fix for every finding.

It finds the interpreter that will run the trainer (through ``accelerate launch`` and venv launch
scripts) and asks it for its torch, safetensors and accelerate versions; runs the command and file
checks of ``doctor_checks``; checks the serializer against float8 weights and ``--resume``, the
free disk for saved states, and the GPUs (NVML).  Findings are blockers (the run would fail),
warnings (it would run, but not as meant) or information; the exit code is 2, 1 or 0 by the worst.

Disk: a saved state holds the trained weights plus AdamW's two moments, so it is estimated as 3x
the trained weights, which are in turn: the largest ``.safetensors`` already in ``--output_dir``
(a LoRA of an earlier run), else ``network_dim * (rows + cols)`` fp32 values for every 2-D weight
of the base model (every linear layer adapted: an upper bound), else a per-dim size by
architecture.  Fewer than 3 states' room is a warning.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ..sensors import gpu
from ..sensors.gpuwatch import visible_devices
from ..trainers.cmdline import TrainerCommand, find_script
from ..trainers.interpreter import Probe, at_least, probe_versions, trainer_python, upgrade_command
from ..trainers.kohya.sthead import float8_dtypes
from .doctor_checks import CommandView, Finding, check_command, load_view

__all__ = ["Report", "doctor", "format_text", "run_doctor"]

GIB = 1 << 30
STATES_WANTED = 3
_PER_DIM_FP32 = {"sd": 2.5e6, "sdxl": 7e6, "dit": 20e6, "unknown": 20e6}  # bytes of LoRA per rank
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


def _size(n: float) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _pip(python: str, spec: str) -> str:
    return " ".join(upgrade_command(python, f'"{spec}"'))


def _demo_flags(command: TrainerCommand) -> frozenset[str] | None:
    """The exact flags of the bundled demo scripts (their argparse; no torch is imported)."""
    token = command.launcher[find_script(command.launcher)].replace("\\", "/")
    if "trainsup.demo." not in token and "trainsup/demo/" not in token:
        return None
    from ..demo.cli import build_parser

    parser = build_parser(flux=command.script == "flux_train_network")
    return frozenset(o[2:] for a in parser._actions for o in a.option_strings if o.startswith("--"))


def _interpreter(command: TrainerCommand, env: Mapping[str, str], demo: bool,
                 probe: Callable[..., Probe]) -> tuple[str | None, dict[str, str | None], list[Finding]]:
    first = command.launcher[0]
    found = shutil.which(first, path=env.get("PATH")) if os.sep not in first else first
    if found is None or not os.path.exists(found):
        return None, {}, [Finding("blocker", "launcher_not_found", f"{first}: not found"
                                  + ("" if os.sep in first else " on PATH"),
                                  "activate the trainer's environment, or give the full path")]
    python = trainer_python(command.launcher, dict(env))
    if python is None:
        return None, {}, [Finding("warning", "python_unknown", f"cannot tell which Python {first} runs "
                                  "(no #! line): its packages are not checked",
                                  "launch the script with the venv's python explicitly")]
    result = probe(python, env=env)
    if result.error is not None:
        return python, {}, [Finding("warning", "python_probe_failed", result.error,
                                    "check that this interpreter starts")]
    findings = [Finding("info", "python", f"{python}: " + ", ".join(
        f"{k} {v or 'missing'}" for k, v in result.versions.items()))]
    needed = {"torch": "install the torch build for your CUDA version into it",
              "safetensors": _pip(python, "safetensors>=0.4.2")}
    if not demo:  # kohya's scripts import accelerate; the bundled demo trainer does not
        needed["accelerate"] = _pip(python, "accelerate")
    for name, fix in needed.items():
        if result.versions.get(name) is None:
            findings.append(Finding("blocker", "missing_package", f"{python} has no {name}", fix))
    return python, result.versions, findings


def _serializer(view: CommandView, python: str | None, versions: dict[str, str | None]) -> list[Finding]:
    st, acc = versions.get("safetensors"), versions.get("accelerate")
    if python is None or st is None:
        return []
    out = []
    float8 = [f"--{k}" for k, h in view.models.items() if float8_dtypes(h)]
    fp8 = [f"--{k}" for k in ("fp8_base", "fp8_base_unet") if view.on(k)]
    if (float8 or fp8) and at_least(st, (0, 4, 2)) is False:
        if float8:  # the model cannot even be loaded, let alone saved
            message = (f"float8 weights in {', '.join(float8)} with safetensors {st} in {python}: versions "
                       "before 0.4.2 cannot even load the model (SafetensorError: Dtype not understood: "
                       "F8_E4M3) nor save float8 (KeyError: torch.float8_e4m3fn)")
        else:
            message = (f"{fp8[0]} with safetensors {st} in {python}: versions before 0.4.2 cannot save "
                       "float8 (KeyError: torch.float8_e4m3fn)")
        out.append(Finding("blocker", "fp8_serializer", message, _pip(python, "safetensors>=0.4.2")))
    if view.value("resume") is not None and acc is not None and at_least(acc, (0, 33)) \
            and at_least(st, (0, 4, 3)) is False:
        out.append(Finding("blocker", "resume_serializer", f"--resume with accelerate {acc} needs safetensors "
                           f">= 0.4.3, {python} has {st} (load_model() got an unexpected keyword argument "
                           "'device')", _pip(python, "safetensors>=0.4.3")))
    return out


def _trained_bytes(view: CommandView, out_dir: Path) -> tuple[float, str]:
    """Estimated size of the trained weights, and how it was estimated."""
    try:
        earlier = [p.stat().st_size for p in out_dir.glob("*.safetensors") if p.is_file()]
    except OSError:
        earlier = []
    if earlier:
        return max(earlier), f"the largest .safetensors already in {out_dir}"
    network = "network" in view.command.script
    try:
        dim = int(str(view.value("network_dim") or 4))
    except ValueError:
        dim = 4
    for name in ("pretrained_model_name_or_path", "dit"):
        header = view.models.get(name)
        if header is not None:
            shapes = [t.shape for t in header.tensors() if len(t.shape) == 2 and t.name.endswith(".weight")]
            if network:
                return 4.0 * dim * sum(r + c for r, c in shapes), f"network_dim {dim} on every linear layer of --{name}"
            return 4.0 * sum(t.numel for t in header.tensors()), f"all weights of --{name} in fp32"
    return dim * _PER_DIM_FP32[view.info.kind], f"about {_size(_PER_DIM_FP32[view.info.kind])} per network_dim"


def _disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def _disk(view: CommandView, disk_free: Callable[[Path], int]) -> list[Finding]:
    out_dir = view.path("output_dir")
    if out_dir is None:
        return []
    existing = out_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK):
        return [Finding("blocker", "output_not_writable", f"--output_dir {view.value('output_dir')}: "
                        f"{existing} is not writable", "choose a directory you can write to")]
    free = disk_free(existing)
    weights, how = _trained_bytes(view, out_dir)
    state = 3 * weights
    room = f"{_size(free)} free in {existing}; a saved state is about {_size(state)} (3x {_size(weights)}: {how})"
    if free < STATES_WANTED * state:
        return [Finding("warning", "disk_space", f"{room}: fewer than {STATES_WANTED} states fit",
                        "free space or put --output_dir on a larger disk (trainsup never deletes checkpoints)")]
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
        memory = (f"{_size(d.free_bytes)} free of {_size(d.total_bytes)}"
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
                            f"{_size(p.used_bytes) if p.used_bytes is not None else 'unknown'}"
                            for p in d.processes[:5])
            out.append(Finding("warning", "gpu_busy", f"GPU {d.index}: {len(d.processes)} other process(es) hold "
                               f"{_size(held)}: {who}", "stop them, or pick a free GPU with CUDA_VISIBLE_DEVICES"))
    return out


def doctor(argv: list[str], cwd: Path, env: Mapping[str, str], *,
           gpu_probe: Callable[[], gpu.GpuProbe] = gpu.probe,
           probe: Callable[..., Probe] = probe_versions,
           disk_free: Callable[[Path], int] = _disk_free) -> Report:
    """Every finding for this command, as the trainer would be started from ``cwd`` with ``env``."""
    try:
        command = TrainerCommand.parse(list(argv))
    except ValueError as exc:
        return Report([Finding("blocker", "command", str(exc), "give the full training command after --")])
    demo_flags = _demo_flags(command)
    view, findings = load_view(command, cwd)
    python, versions, found = _interpreter(command, env, demo_flags is not None, probe)
    findings += found
    findings += check_command(view, demo_flags)
    findings += _serializer(view, python, versions)
    findings += _disk(view, disk_free)
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


def run_doctor(argv: list[str], *, as_json: bool, cwd: Path, env: Mapping[str, str], out: TextIO) -> int:
    """The verb: 0 no findings, 1 warnings only, 2 blockers."""
    report = doctor(argv, cwd, env)
    print(json.dumps(report.as_json(), ensure_ascii=False) if as_json else format_text(report), file=out)
    return report.exit_code
