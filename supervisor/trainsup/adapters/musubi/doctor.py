"""Owns musubi-tuner's side of ``trainsup doctor``: what would make the run fail that can be seen
before it starts, read from the command and its files only.

- no attention flag (``--sdpa``, ``--flash_attn``, ``--sage_attn``, ``--xformers``, ``--flash3``):
  musubi exits 1 before the DiT loads;
- no ``--output_name``: musubi trains to the end and dies at the final save (no final LoRA);
- its dataset TOML unreadable, or an ``image_directory``/``video_directory`` missing;
- its caches (``caches``): none a run could train on (musubi exits 1, ``No training items found``)
  is a blocker; a latent cache without its text-encoder cache (the item is skipped), media without
  a latent cache (not trained on), a cache of deleted media (still trained on), and a caption or
  image edited since its cache was made (training would use the old one) are warnings; the fix is
  the caching commands, built from the training command's model paths;
- on a CPU-only torch (its version's ``+cpu`` label; trainsup knows no more of the GPU here):
  ``--fp8_base`` without ``--fp8_scaled`` and ``--blocks_to_swap`` fail at the first step (both
  seen on the realmusubi CPU bed), ``--fp8_base --fp8_scaled`` runs, slower;
- a ``--sample_prompts`` file that is not there; a ``--resume`` that is not a complete state;
- the packages sd-scripts' doctor asks for (torch, safetensors, accelerate), as there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...trainers.base import DoctorFacts, Finding
from ..kohya import doctor as kohya_doctor
from ..kohya import tomlio
from ..kohya.doctor_checks import CommandView, missing_prompts
from ..kohya.states import check_state
from . import caches
from .profile import ATTENTION, MUSUBI


def findings(view: CommandView, facts: DoctorFacts) -> list[Finding]:
    return [*view.config_findings, *kohya_doctor.packages(view, facts), *_attention(view), *_output_name(view),
            *_dataset(view), *missing_prompts(view), *_resume(view), *_cpu_only(view, facts)]


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
    return out if out else _caches(view, config, doc)


def _caches(view: CommandView, config: Path, doc: dict[str, Any]) -> list[Finding]:
    """The caches musubi would train on, against the dataset's media and captions."""
    caching = caches.caching_for(view.command.script)
    commands = caches.caching_commands(view.command, str(view.value("dataset_config")))
    if commands is None:
        latents_fix = text_fix = both = ("run the model's *_cache_latents.py and *_cache_text_encoder_outputs.py "
                                         "scripts with this --dataset_config")
    else:
        latents_fix, text_fix = (f"run {c}" for c in commands)
        both = f"run {commands[0]}, then {commands[1]}"
    reports = [caches.inspect(ds, caching.architectures if caching else ()) for ds in caches.datasets(doc, view.cwd)]
    where = config.name
    if reports and not sum(r.trainable for r in reports):
        parts = [f"datasets[{r.dataset.index}]: " + (f"{len(r.no_te)} latent cache(s) without their text-encoder "
                                                     f"cache in {r.dataset.cache_dir}" if r.latents else
                                                     f"no latent cache in {r.dataset.cache_dir}") for r in reports]
        return [Finding("blocker", "missing_cache", f"{where}: nothing to train on ({'; '.join(parts)}): "
                        "musubi-tuner trains only on its caches and stops with 'No training items found'", both)]
    out = []
    for r in reports:
        at = f"{where} datasets[{r.dataset.index}]"
        if not r.latents:
            out.append(Finding("warning", "missing_cache", f"{at}: no latent cache in {r.dataset.cache_dir}: "
                               "musubi-tuner trains without this dataset", both))
            continue
        if r.no_te:
            out.append(Finding("warning", "missing_te_cache", f"{at}: no text-encoder cache for "
                               f"{caches.shown(r.no_te)}: musubi-tuner skips them (a WARNING line) and trains "
                               "on the rest", text_fix))
        if r.uncached:
            out.append(Finding("warning", "uncached_media", f"{at}: no latent cache for {caches.shown(r.uncached)}: "
                               "musubi-tuner does not train on them", both))
        if r.orphans:
            out.append(Finding("warning", "orphan_cache", f"{at}: cache(s) of {caches.shown(r.orphans)}, whose "
                               f"{'video' if r.dataset.video else 'image'} is gone: musubi-tuner still trains on "
                               "them", f"{latents_fix} (it deletes caches of removed items unless --keep_cache)"))
        if r.stale_media:
            out.append(Finding("warning", "stale_cache", f"{at}: {caches.shown(r.stale_media)} changed after its "
                               "latent cache was made: musubi-tuner would train on the old one", latents_fix))
        if r.stale_captions:
            out.append(Finding("warning", "stale_cache", f"{at}: the caption of {caches.shown(r.stale_captions)} "
                               "differs from the one its text-encoder cache was made from: musubi-tuner would "
                               "train on the old caption", text_fix))
    return out


def _cpu_only(view: CommandView, facts: DoctorFacts) -> list[Finding]:
    """Flags that need CUDA, on a torch built without it (a ``+cpu`` version). Any other torch, or none
    found, says nothing certain about CUDA here: no finding."""
    torch = facts.versions.get("torch")
    if not torch or "+cpu" not in torch:
        return []
    out = []
    if view.on("fp8_base") and not view.on("fp8_scaled"):
        out.append(Finding("blocker", "fp8_on_cpu", f"--fp8_base without --fp8_scaled on torch {torch} (no CUDA): "
                           "musubi-tuner fails at the first step (mat1 and mat2 must have the same dtype)",
                           "add --fp8_scaled, or drop --fp8_base"))
    if view.on("blocks_to_swap"):
        out.append(Finding("blocker", "block_swap_on_cpu", f"--blocks_to_swap on torch {torch} (no CUDA): "
                           "musubi-tuner swaps blocks with CUDA streams and fails at the first step",
                           "drop --blocks_to_swap (on CPU, --gradient_checkpointing saves memory)"))
    return out


def _resume(view: CommandView) -> list[Finding]:
    path = view.path("resume")
    if path is None:
        return []
    check = check_state(path, dialect=MUSUBI)
    if not check.ok:
        return [Finding("blocker", "incomplete_resume", f"--resume {view.value('resume')}: not a complete "
                        f"state ({check.reason})", "resume from an earlier, complete state")]
    return []
