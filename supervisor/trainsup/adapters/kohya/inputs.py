"""Owns sd-scripts' live inputs: the prompt, config, dataset-config and caption files edited mid-run.

Every launch gets frozen copies (prompt snapshot, derived configs) from the run dir, so an edit can
reach the trainer only through here. An edit is validated first (a bad one is rejected with its
line and the run keeps what it has); a good one is applied at once where the trainer reads it live
(sample prompts of SD1/SDXL scripts, or without text-encoder caching), or scheduled for the next
checkpoint where the trainer cached it at start-up (prompts under text-encoder caching, configs).
Caption and resolution edits invalidate exactly the stale cache files at the next launch.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from ...record.fsutil import atomic_write_bytes
from ...record.journal import Journal
from ...record.textfmt import shown_path
from ...sensors.watch import FileWatcher
from ...trainers.base import EditAction, Inputs, Plan, Settings
from ...trainers.edits import EditLog
from . import tomlio
from .caches import LATENT_KEYS, CacheManifest, Subset, set_aside, stale_caches
from .plan import LaunchPlan
from .profile import RESUME_LOCKED
from .prompts import PromptError, parse_prompt_bytes


def _resolve(value: object, cwd: Path) -> Path | None:
    if not value:
        return None
    p = Path(str(value)).expanduser()
    return (p if p.is_absolute() else cwd / p).resolve()


def _collect(doc: object, keys: tuple[str, ...], prefix: str = "") -> dict[str, object]:
    """Every value of these keys anywhere in a TOML document (tables and arrays of tables)."""
    found: dict[str, object] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in keys and not isinstance(v, (dict, list)) or k in keys and isinstance(v, list) \
                    and not any(isinstance(x, dict) for x in v):
                found[prefix + k] = v
            else:
                found.update(_collect(v, keys, f"{prefix}{k}."))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found.update(_collect(v, keys, f"{prefix}{i}."))
    return found


class KohyaInputs(Inputs):
    def __init__(self, plan: LaunchPlan, cwd: Path, run_dir: Path, settings: Settings,
                 journal: Journal, say: Callable[[str], None]) -> None:
        self.run_dir, self.cwd, self.journal, self.say = run_dir, cwd, journal, say
        self.settings = settings
        self.edits = EditLog(journal, say)
        self.prompt_options = plan.dialect.prompt_options  # the trainer's own prompt-line options
        self.prompt_src = _resolve(plan.value("sample_prompts"), cwd)
        self.prompt_bytes = self._read(self.prompt_src)
        self.config_src = plan.user_config
        self.config_doc = plan.config_doc
        self.dataset_src = _resolve(plan.value("dataset_config"), cwd)
        self.dataset_doc: tomlio.TomlDoc | None = None
        if self.dataset_src is not None:
            try:
                self.dataset_doc = tomlio.read_toml(self.dataset_src)
            except tomlio.ConfigFileError:
                self.dataset_doc = None  # the trainer reports it; a restart cannot fix it
        self.train_data_dir = _resolve(plan.value("train_data_dir"), cwd)
        self.caption_extension = str(plan.value("caption_extension") or "") or None
        self.manifest = CacheManifest.load(run_dir / "caches.json")
        plan.user_dataset, plan.dataset_doc = self.dataset_src, self.dataset_doc
        self.snapshot: Path | None = None  # the current attempt's prompt snapshot
        self.attempt = 0
        self.te_cached = False

    @staticmethod
    def _read(path: Path | None) -> bytes | None:
        try:
            return path.read_bytes() if path is not None else None
        except OSError:
            return None

    # --- what to watch ---------------------------------------------------------------------------
    def subsets(self) -> list[Subset]:
        subsets: list[Subset] = []
        if self.dataset_doc is not None:
            general = self.dataset_doc.get("general", {})
            for dataset in self.dataset_doc.get("datasets", []) or []:
                for sub in dataset.get("subsets", []) or []:
                    image_dir = _resolve(sub.get("image_dir"), self.cwd)
                    if image_dir is not None:
                        ext = sub.get("caption_extension") or dataset.get("caption_extension") \
                            or general.get("caption_extension") or self.caption_extension
                        subsets.append(Subset(image_dir.parent, image_dir, ext))
        elif self.train_data_dir is not None and self.train_data_dir.is_dir():
            dirs = sorted(d for d in self.train_data_dir.iterdir() if d.is_dir() and re.match(r"^\d+_", d.name))
            for d in dirs or [self.train_data_dir]:
                subsets.append(Subset(self.train_data_dir, d, self.caption_extension))
        return subsets

    def watch(self, watcher: FileWatcher) -> None:
        for path in self._files():
            watcher.watch_file(path)
        for subset in self.subsets():
            watcher.watch_tree(subset.image_dir, subset.caption_extensions)
        self._trees = [s.image_dir for s in self.subsets()]

    def _files(self) -> list[Path]:
        return [p for p in (self.prompt_src, self.config_src, self.dataset_src) if p is not None]

    def owns(self, path: Path) -> bool:
        return path in self._files() or any(path.is_relative_to(t) for t in getattr(self, "_trees", ()))

    def settings_changed(self, settings: Settings) -> None:
        self.settings = settings

    # --- launching -------------------------------------------------------------------------------
    def before_launch(self, attempt: int, launch: LaunchPlan) -> None:
        """Give the launch its frozen copies, set stale caches aside, and report pending changes."""
        self.attempt = attempt
        info = launch.info
        self.te_cached = info.kind == "dit" and (launch.effective("cache_text_encoder_outputs")
                                                  or launch.effective("cache_text_encoder_outputs_to_disk"))
        launch.config_doc, launch.dataset_doc = self.config_doc, self.dataset_doc  # the accepted content
        if self.prompt_src is not None and self.prompt_bytes is not None and self.settings.snapshot_prompts:
            self.snapshot = self.run_dir / "prompts" / f"attempt-{attempt}{self.prompt_src.suffix}"
            self.snapshot.parent.mkdir(parents=True, exist_ok=True)
            self.snapshot.write_bytes(self.prompt_bytes)
            launch.command.set("sample_prompts", str(self.snapshot))
        latent_settings = {k: launch.value(k) for k in LATENT_KEYS}
        latent_settings.update(_collect(self.dataset_doc, LATENT_KEYS, "dataset."))
        stale = stale_caches(self.subsets(), self.manifest, latent_settings, time.time())
        moved = set_aside(stale, self.run_dir)
        self.manifest.save()
        if moved:
            self.journal.event("cache_invalidated", files=moved, attempt=attempt)
            self.say(f"{len(moved)} cached file(s) no longer match their images or settings: moved to "
                     f"{shown_path(self.run_dir / 'invalidated')}; the trainer caches them again")
        self.edits.launched(attempt)

    # --- edits -----------------------------------------------------------------------------------
    def on_change(self, path: Path, kind: str, plan: Plan | None = None) -> EditAction:
        if path in self._files() and kind == "deleted":
            self.edits.deleted(path)
            return "none"
        self.edits.present(path)
        if path == self.prompt_src:
            action = self._prompt_changed(path)
        elif path == self.config_src:
            action = self._config_changed(path, dataset=False)
        elif path == self.dataset_src:
            action = self._config_changed(path, dataset=True)
        else:
            self.edits.schedule(path, "next_launch")  # a caption: its stale cache is set aside at the next launch
            action = "none"
        if isinstance(plan, LaunchPlan):  # remedies read the accepted configs
            plan.config_doc, plan.dataset_doc = self.config_doc, self.dataset_doc
        return action

    def _prompt_changed(self, path: Path) -> EditAction:
        # Read once: the bytes validated are the bytes used, whatever the editor writes meanwhile.
        raw = self._read(path)
        try:
            if raw is None:
                raise PromptError(path, None, "cannot read it")
            parse_prompt_bytes(path, raw, self.prompt_options)
        except PromptError as exc:
            return self.edits.reject(path, exc.reason, exc.line)
        mode = self.settings.on_prompt_change
        if not self.settings.snapshot_prompts:
            self.say(f"{shown_path(path)} changed; live.snapshot_prompts=false: the trainer reads it directly")
            return "none"
        if mode == "ignore":
            self.say(f"{shown_path(path)} changed; on_prompt_change=ignore keeps the current prompts")
            return "none"
        self.prompt_bytes = raw
        if not self.te_cached and self.snapshot is not None and self.prompt_bytes is not None:
            atomic_write_bytes(self.snapshot, self.prompt_bytes)  # re-read at each sampling: swapped whole
            self.edits.applied_now(path, self.attempt)
            self.say(f"{shown_path(path)} edited: the next samples use the new prompts")
            return "none"
        self.edits.schedule(path, mode)
        when = "now (the trainer restarts from its last save)" if mode == "now" else "from the next checkpoint"
        self.say(f"{shown_path(path)} edited: the trainer caches its prompts, so the new ones apply {when}")
        return "now" if mode == "now" else "at_checkpoint"

    def _config_changed(self, path: Path, dataset: bool) -> EditAction:
        try:
            new = tomlio.read_toml(path)
        except tomlio.ConfigFileError as exc:
            m = re.search(r"line (\d+)", str(exc))
            return self.edits.reject(path, str(exc), int(m.group(1)) if m else None)
        old: dict[str, object] = (self.dataset_doc if dataset else self.config_doc) or {}
        old_flat, new_flat = tomlio.flat_keys(old), tomlio.flat_keys(new)
        changed = sorted(k for k in set(old_flat) | set(new_flat) if old_flat.get(k) != new_flat.get(k))
        if not changed and old == new:
            return "none"
        locked = [k for k in changed if k in RESUME_LOCKED]
        fp16 = [old_flat.get("mixed_precision") == "fp16", new_flat.get("mixed_precision") == "fp16"]
        if fp16[0] != fp16[1]:
            locked.append("mixed_precision (into or out of fp16)")
        if locked:
            return self.edits.reject(path, "cannot change under a resume: " + ", ".join(locked), None)
        if dataset:
            self.dataset_doc = new
        else:
            self.config_doc = new
        self.edits.schedule(path, "at_checkpoint")
        self.say(f"{shown_path(path)} edited ({', '.join(changed) or 'layout only'}): applied from the next "
                 "checkpoint")
        return "at_checkpoint"
