"""Owns musubi-tuner's side of ``trainsup doctor``: what would make the run fail that can be seen
before it starts, read from the command and its files only.

- no attention flag (``--sdpa``, ``--flash_attn``, ``--sage_attn``, ``--xformers``, ``--flash3``):
  musubi exits 1 before the DiT loads;
- no ``--output_name``: musubi trains to the end and dies at the final save (no final LoRA);
- its dataset TOML unreadable, an ``image_directory``/``video_directory`` missing, or a dataset's
  ``cache_directory`` without the latent caches musubi trains on (it reads only the caches, written
  by its separate caching scripts, and exits 1 with none);
- a ``--sample_prompts`` file that is not there; a ``--resume`` that is not a complete state;
- the packages sd-scripts' doctor asks for (torch, safetensors, accelerate), as there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...trainers.base import DoctorFacts, Finding
from ..kohya import doctor as kohya_doctor
from ..kohya import tomlio
from ..kohya.doctor_checks import CommandView
from ..kohya.states import check_state
from .profile import ATTENTION, MUSUBI


def findings(view: CommandView, facts: DoctorFacts) -> list[Finding]:
    return [*view.config_findings, *kohya_doctor.packages(view, facts), *_attention(view), *_output_name(view),
            *_dataset(view), *_prompts(view), *_resume(view)]


def _attention(view: CommandView) -> list[Finding]:
    if any(view.on(flag) for flag in ATTENTION):
        return []
    return [Finding("blocker", "no_attention_flag", "no attention flag: musubi-tuner exits at start-up "
                    "('either --sdpa, --flash-attn, ... must be specified')", "add --sdpa")]


def _output_name(view: CommandView) -> list[Finding]:
    if view.value("output_name"):
        return []
    return [Finding("blocker", "no_output_name", "no --output_name: musubi-tuner trains to the end and then "
                    "fails at the final save, leaving no final weights", "add --output_name NAME")]


def _path(value: object, cwd: Path) -> Path | None:
    if not isinstance(value, str) or not value:
        return None
    p = Path(value).expanduser()
    return p if p.is_absolute() else cwd / p


def datasets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``[[datasets]]`` tables of a musubi dataset TOML, each with ``[general]``'s keys under it."""
    found = doc.get("general")
    general: dict[str, Any] = found if isinstance(found, dict) else {}
    return [{**general, **d} for d in doc.get("datasets", []) or [] if isinstance(d, dict)]


def _dataset(view: CommandView) -> list[Finding]:
    config = view.path("dataset_config")
    if config is None:
        return [Finding("blocker", "missing_dataset", "no --dataset_config: musubi-tuner trains only from its "
                        "dataset TOML", "add --dataset_config FILE.toml")]
    try:
        doc = tomlio.read_toml(config)
    except (tomlio.ConfigFileError, OSError) as exc:
        return [Finding("blocker", "dataset_config", f"--dataset_config {exc}", "give an existing, valid dataset TOML")]
    out = []
    for i, ds in enumerate(datasets(doc)):
        for key in ("image_directory", "video_directory"):
            path = _path(ds.get(key), view.cwd)
            if path is not None and not path.is_dir():
                out.append(Finding("blocker", "missing_dataset", f"{config.name} datasets[{i}].{key} "
                                   f"{ds.get(key)}: no such directory", f"fix {key}"))
        cache = _path(ds.get("cache_directory"), view.cwd) or _path(ds.get("image_directory"), view.cwd)
        if cache is not None and cache.is_dir() and not any(cache.glob("*.safetensors")):
            out.append(Finding("blocker", "missing_cache", f"{config.name} datasets[{i}]: no latent cache in "
                               f"{cache} (musubi-tuner trains only on its caches and stops with 'No training "
                               "items found')", "run the model's *_cache_latents.py and "
                               "*_cache_text_encoder_outputs.py scripts with this --dataset_config first"))
    return out


def _prompts(view: CommandView) -> list[Finding]:
    prompts = view.path("sample_prompts")
    if prompts is not None and not prompts.is_file():
        return [Finding("blocker", "missing_prompts", f"--sample_prompts {view.value('sample_prompts')}: "
                        "no such file", "give an existing prompt file, or drop --sample_prompts")]
    return []


def _resume(view: CommandView) -> list[Finding]:
    path = view.path("resume")
    if path is None:
        return []
    check = check_state(path, dialect=MUSUBI)
    if not check.ok:
        return [Finding("blocker", "incomplete_resume", f"--resume {view.value('resume')}: not a complete "
                        f"state ({check.reason})", "resume from an earlier, complete state")]
    return []
