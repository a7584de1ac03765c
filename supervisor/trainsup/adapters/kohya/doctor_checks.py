"""Owns the preflight checks of a kohya command line and the files it names (``trainsup doctor``
through ``KohyaRun.doctor``; ``doctor`` puts them together with the version checks).

Everything here reads files only: flags the script does not have, fp8 flags without mixed
precision, text-encoder caching with caption dropout/shuffle, missing model, dataset, prompt and
config files, model dtypes (safetensors headers, no tensor loaded) and the resume point.  What
needs a subprocess or the GPU (the trainer's package versions, NVML) ``trainsup doctor`` finds and
hands over (``DoctorFacts``).

kohya reads ``--config_file`` flattened with the command line winning, and the dataset config
with subset > dataset > general > command line; the checks see the values the trainer will see.
``load_view`` reads the config file and the model headers once; the checks only judge the view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...trainers.base import Finding
from ...trainers.cmdline import TrainerCommand, find_script
from ...trainers.sthead import Header, HeaderError, float8_dtypes, load_header
from . import tomlio
from .profile import ScriptInfo, script_info
from .states import check_state

__all__ = ["CommandView", "check_command", "load_view"]

# Flags that exist in no kohya script, with what to use instead.
NOWHERE = {
    "lowvram": "no kohya script has it (it is an AUTOMATIC1111/ComfyUI option); to save VRAM use "
               "--gradient_checkpointing, --fp8_base or, in DiT scripts, --blocks_to_swap",
    "medvram": "no kohya script has it (it is an AUTOMATIC1111 option); use --gradient_checkpointing",
    "xformers_attention": "no kohya script has it; the flag is --xformers",
}
MODEL_FLAGS = ("pretrained_model_name_or_path", "dit", "ae", "vae", "clip_l", "clip_g", "t5xxl",
               "text_encoder", "text_encoder1", "text_encoder2", "network_weights")
BASE_MODEL_FLAGS = ("pretrained_model_name_or_path", "dit")
_MODEL_SUFFIXES = (".safetensors", ".sft", ".ckpt", ".pt", ".pth", ".bin", ".gguf")
_IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".avif", ".jxl"})
# Caption augmentations that make cached text-encoder outputs wrong; kohya refuses them together.
CAPTION_AUGMENTATIONS = ("shuffle_caption", "caption_dropout_rate", "caption_tag_dropout_rate",
                         "caption_dropout_every_n_epochs", "token_warmup_step")


@dataclass
class CommandView:
    """The flags the trainer will see: command line over ``--config_file``; paths from ``cwd``."""

    command: TrainerCommand
    cwd: Path
    config: dict[str, Any] = field(default_factory=dict)
    models: dict[str, Header] = field(default_factory=dict)  # readable safetensors model files, by flag
    config_findings: list[Finding] = field(default_factory=list)  # --config_file unreadable
    model_findings: list[Finding] = field(default_factory=list)  # model files missing, unreadable, on the Hub

    @property
    def info(self) -> ScriptInfo:
        return script_info(self.command.script)

    def value(self, name: str) -> object | None:
        for flag in reversed(self.command.flags):
            if flag.name == name:
                return True if not flag.values else flag.values[-1]
        return self.config.get(name)

    def on(self, name: str) -> bool:
        """Whether a flag is set to something that counts as on (true, or a number above 0)."""
        return _on(self.value(name))

    def path(self, name: str) -> Path | None:
        value = self.value(name)
        if not isinstance(value, str) or not value:
            return None
        p = Path(value).expanduser()
        return p if p.is_absolute() else self.cwd / p


def _on(value: object) -> bool:
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value > 0
    if isinstance(value, str):
        try:
            return float(value) > 0
        except ValueError:
            return value.lower() not in ("", "false", "0", "no")
    return True


def load_view(command: TrainerCommand, cwd: Path) -> CommandView:
    """The flags and files as the trainer will see them: ``--config_file`` and the model headers read."""
    view = CommandView(command, cwd)
    path = view.path("config_file")
    if path is not None:
        if not path.name.endswith(".toml"):
            path = path.with_name(path.name + ".toml")  # as kohya does (train_util.read_config_from_file)
        try:
            view.config = tomlio.flat_keys(tomlio.read_toml(path))
        except (tomlio.ConfigFileError, OSError) as exc:
            view.config_findings.append(Finding("blocker", "config_file", f"--config_file {exc}",
                                                "give an existing, valid TOML file"))
    view.model_findings = _read_models(view)
    return view


def check_command(view: CommandView, script_flags: frozenset[str] | None) -> list[Finding]:
    """Every check of this module, in the order they are reported (the config file's own finding
    is ``view.config_findings``)."""
    return [*_script(view), *_flags(view, script_flags), *_fp8_flags(view), *view.model_findings,
            *_fp8_weights(view), *_dataset(view), *missing_prompts(view), *_resume_state(view), *_resume_point(view)]


def _script(view: CommandView) -> list[Finding]:
    token = view.command.launcher[find_script(view.command.launcher)]
    if token.endswith(".py"):
        path = Path(token).expanduser()
        if not (path if path.is_absolute() else view.cwd / path).is_file():
            return [Finding("blocker", "missing_script", f"{token}: no such file",
                            "run from the sd-scripts folder, or give the script's full path")]
    return []


def _flags(view: CommandView, script_flags: frozenset[str] | None) -> list[Finding]:
    out = []
    script = view.command.script
    for name in dict.fromkeys(f.name for f in view.command.flags):
        why = None
        if name in NOWHERE:
            why = NOWHERE[name]
        elif "-" in name:
            why = f"kohya's flags use underscores (--{name.replace('-', '_')})"
        elif script_flags is not None and name not in script_flags:
            why = f"{script}'s own argument parser has no such flag"  # a stand-in's (the demo's)
        elif not view.info.has_flag(name):
            why = f"{script} ({view.info.kind} scripts) has no such flag"
        if why is not None:
            out.append(Finding("blocker", "unknown_flag", f"--{name}: {why}; the trainer would stop with "
                               "'unrecognized arguments'", f"remove --{name}"))
    return out


def _fp8_flags(view: CommandView) -> list[Finding]:
    fp8 = [n for n in ("fp8_base", "fp8_base_unet") if view.on(n)]
    precision = view.value("mixed_precision")
    if fp8 and precision not in ("fp16", "bf16"):
        return [Finding("blocker", "fp8_needs_mixed_precision",
                        f"--{fp8[0]} needs --mixed_precision fp16 or bf16 (it is {precision or 'no'}); "
                        "kohya refuses it at start-up", "add --mixed_precision bf16")]
    return []


def _looks_local(value: str) -> bool:
    return (value.lower().endswith(_MODEL_SUFFIXES) or value.startswith(("/", "./", "../", "~", "."))
            or "\\" in value or value.count("/") != 1)


def _read_models(view: CommandView) -> list[Finding]:
    """Load the headers of the safetensors model files into ``view.models``; what is wrong with any."""
    out = []
    for name in MODEL_FLAGS:
        raw = view.value(name)
        path = view.path(name)
        if path is None or not isinstance(raw, str):
            continue
        if not path.exists():
            if name == "pretrained_model_name_or_path" and not _looks_local(raw):
                out.append(Finding("info", "model_from_hub", f"--{name} {raw} is not a local path: the "
                                   "trainer will fetch it from the Hugging Face Hub"))
            else:
                out.append(Finding("blocker", "missing_model", f"--{name} {raw}: no such file",
                                   "give the path of an existing model file"))
            continue
        if path.is_file() and path.suffix.lower() in (".safetensors", ".sft"):
            try:
                header = load_header(path)
                header.tensors()
            except (HeaderError, OSError) as exc:
                out.append(Finding("blocker", "unreadable_model", f"--{name} {raw}: not a readable "
                                   f"safetensors file ({exc})", "download or copy the file again"))
                continue
            view.models[name] = header
    return out


def _fp8_weights(view: CommandView) -> list[Finding]:
    out = []
    fp8_on = view.on("fp8_base") or view.on("fp8_base_unet")
    for name in BASE_MODEL_FLAGS:
        base = view.models.get(name)
        kinds = float8_dtypes(base) if base is not None else None
        if kinds and not fp8_on:
            out.append(Finding("warning", "fp8_weights_without_fp8_base",
                               f"--{name} holds float8 weights ({', '.join(sorted(kinds))}) but --fp8_base "
                               "is not set; fp8 repacks often load only with it", "add --fp8_base "
                               "(with --mixed_precision bf16)"))
    return out


def _has_image(root: Path, depth: int = 2) -> bool:
    try:
        entries = list(root.iterdir())
    except OSError:
        return False
    if any(e.suffix.lower() in _IMAGE_SUFFIXES and e.is_file() for e in entries):
        return True
    return depth > 0 and any(e.is_dir() and _has_image(e, depth - 1) for e in entries)


def _table(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _tables(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _subsets(view: CommandView, doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every subset with its settings resolved (subset > dataset > general > command line)."""
    general = _table(doc.get("general"))
    out = []
    datasets = [d for d in _tables(doc.get("datasets")) if d]
    for i, dataset in enumerate(datasets):
        for j, subset in enumerate(_tables(dataset.get("subsets"))):
            merged = {k: view.value(k) for k in CAPTION_AUGMENTATIONS}
            for layer in (general, dataset, subset):
                merged.update({k: v for k, v in layer.items() if not isinstance(v, (dict, list))})
            out.append((f"datasets[{i}].subsets[{j}]", merged))
    return out


def _dataset(view: CommandView) -> list[Finding]:
    out = []
    config = view.path("dataset_config")
    resolved: list[tuple[str, dict[str, Any]]] = []
    if config is not None:
        try:
            resolved = _subsets(view, tomlio.read_toml(config))
        except (tomlio.ConfigFileError, OSError) as exc:
            return [Finding("blocker", "dataset_config", f"--dataset_config {exc}",
                            "give an existing, valid dataset TOML")]
        for where, subset in resolved:
            image_dir = subset.get("image_dir")
            if isinstance(image_dir, str):
                path = Path(image_dir).expanduser()
                path = path if path.is_absolute() else view.cwd / path
                if not path.is_dir():
                    out.append(Finding("blocker", "missing_dataset", f"{config.name} {where}.image_dir "
                                       f"{image_dir}: no such directory", "fix image_dir"))
    else:
        data = view.path("train_data_dir")
        if data is None:
            out.append(Finding("blocker", "missing_dataset", "no dataset: neither --train_data_dir nor "
                               "--dataset_config is given", "add --train_data_dir DIR"))
        elif not data.is_dir():
            out.append(Finding("blocker", "missing_dataset", f"--train_data_dir {view.value('train_data_dir')}: "
                               "no such directory", "give the directory holding the images"))
        elif not _has_image(data):
            out.append(Finding("blocker", "missing_dataset", f"--train_data_dir {view.value('train_data_dir')}: "
                               "no images in it or its subfolders (kohya stops with 'No data found')",
                               "point it at the folder whose N_name subfolders hold the images"))
        resolved = [("the command line", {k: view.value(k) for k in CAPTION_AUGMENTATIONS})]
    if view.on("cache_text_encoder_outputs") or view.on("cache_text_encoder_outputs_to_disk"):
        for where, subset in resolved:
            used = [k for k in CAPTION_AUGMENTATIONS if _on(subset.get(k))]
            if used:
                flags = ", ".join(f"--{k}" for k in used)
                out.append(Finding("blocker", "te_cache_with_caption_augmentation",
                                   f"text-encoder output caching cannot be used with {flags} ({where}); "
                                   "kohya refuses the combination at start-up",
                                   f"remove {flags}, or remove --cache_text_encoder_outputs"))
    return out


def missing_prompts(view: CommandView) -> list[Finding]:
    """A ``--sample_prompts`` file that is not there (musubi-tuner's doctor asks the same)."""
    prompts = view.path("sample_prompts")
    if prompts is not None and not prompts.is_file():
        return [Finding("blocker", "missing_prompts", f"--sample_prompts {view.value('sample_prompts')}: "
                        "no such file", "give an existing prompt file, or drop --sample_prompts")]
    return []


def _resume_state(view: CommandView) -> list[Finding]:
    path = view.path("resume")
    if path is None:
        return []
    if not path.is_dir():
        return [Finding("blocker", "missing_resume", f"--resume {view.value('resume')}: no such state "
                        "directory", "give a saved state directory (NAME-stepNNNNNNNN-state)")]
    check = check_state(path, need_scaler=view.value("mixed_precision") == "fp16")
    if not check.ok:
        return [Finding("blocker", "incomplete_resume", f"--resume {view.value('resume')}: not a complete "
                        f"state ({check.reason})", "resume from an earlier, complete state")]
    return []


def _resume_point(view: CommandView) -> list[Finding]:
    if not view.on("save_state"):
        return [Finding("warning", "no_save_state", "without --save_state kohya saves no state: a crash "
                        "loses all progress (trainsup run adds --save_state with a step cadence)",
                        "add --save_state --save_every_n_steps N")]
    if not (view.on("save_every_n_steps") or view.on("save_every_n_epochs")):
        return [Finding("warning", "no_save_state", "--save_state without --save_every_n_steps or "
                        "--save_every_n_epochs saves a state only at the end: no resume point on the way",
                        "add --save_every_n_steps N")]
    return []
