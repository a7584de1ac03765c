"""Owns sd-scripts' side of ``trainsup doctor`` (``KohyaRun.doctor`` and ``KohyaRun.state_size``):
the command and file checks of ``doctor_checks``, and what needs the trainer's package versions,
which doctor asked its interpreter for (``DoctorFacts``): torch, safetensors and accelerate present,
the serializer against float8 weights and ``--resume``.

A saved state holds the trained weights plus AdamW's two moments, so it is estimated as 3x the
trained weights, which are in turn: the largest ``.safetensors`` already in ``--output_dir`` (a LoRA
of an earlier run), else ``network_dim * (rows + cols)`` fp32 values for every 2-D weight of the
base model (every linear layer adapted: an upper bound), else a per-dim size by architecture.
doctor weighs it against the free space in ``--output_dir``.
"""

from __future__ import annotations

from pathlib import Path

from ...record.textfmt import format_size
from ...trainers.base import DoctorFacts, Finding
from ...trainers.interpreter import at_least, upgrade_command
from ...trainers.sthead import float8_dtypes
from .doctor_checks import CommandView, check_command

__all__ = ["PACKAGES", "findings", "packages", "state_size"]

PACKAGES = ("torch", "safetensors", "accelerate")  # what doctor asks the trainer's interpreter for
_PER_DIM_FP32 = {"sd": 2.5e6, "sdxl": 7e6, "dit": 20e6, "unknown": 20e6}  # bytes of LoRA per rank


def _pip(python: str, spec: str) -> str:
    return " ".join(upgrade_command(python, f'"{spec}"'))


def findings(view: CommandView, facts: DoctorFacts) -> list[Finding]:
    """Every kohya finding on this command, in the order they are reported."""
    return [*view.config_findings, *packages(view, facts), *check_command(view, facts.script_flags),
            *_serializer(view, facts), *_exact_resume(view)]


WORKERS_0_NOTE = ("--max_data_loader_n_workers 0: after a resume sd-scripts fetches the resumed epoch's first "
                  "batch before it sets the epoch, so a resumed run's weights differ slightly from an "
                  "uninterrupted one's (steps and names stay true; see docs/guides/resume.md)")


def _exact_resume(view: CommandView) -> list[Finding]:
    """What keeps a resumed run from ending with an uninterrupted run's weights."""
    if str(view.value("max_data_loader_n_workers")) == "0":
        return [Finding("info", "inexact_resume", WORKERS_0_NOTE,
                        "--max_data_loader_n_workers 1 (or more) makes a resume bit-exact")]
    return []


def packages(view: CommandView, facts: DoctorFacts) -> list[Finding]:
    python = facts.python
    if python is None:
        return []
    needed = {"torch": "install the torch build for your CUDA version into it",
              "safetensors": _pip(python, "safetensors>=0.4.2")}
    if facts.script_flags is None:  # kohya's scripts import accelerate; a stand-in (the demo) does not
        needed["accelerate"] = _pip(python, "accelerate")
    return [Finding("blocker", "missing_package", f"{python} has no {name}", fix)
            for name, fix in needed.items() if facts.versions.get(name) is None]


def _serializer(view: CommandView, facts: DoctorFacts) -> list[Finding]:
    python = facts.python
    st, acc = facts.versions.get("safetensors"), facts.versions.get("accelerate")
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


def _trained_bytes(view: CommandView, out_dir: Path | None) -> tuple[float, str]:
    """Estimated size of the trained weights, and how it was estimated."""
    try:
        earlier = [p.stat().st_size for p in out_dir.glob("*.safetensors") if p.is_file()] if out_dir else []
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
    per_dim = _PER_DIM_FP32[view.info.kind]
    return dim * per_dim, f"about {format_size(per_dim)} per network_dim"


def state_size(view: CommandView) -> tuple[float, str]:
    """One saved state's estimated bytes (3x the trained weights), and how it was estimated."""
    weights, how = _trained_bytes(view, view.path("output_dir"))
    return 3 * weights, f"3x {format_size(weights)}: {how}"
