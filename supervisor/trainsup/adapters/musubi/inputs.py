"""Owns musubi-tuner's live inputs: sd-scripts' (prompt file, dataset TOML, through ``KohyaInputs``),
plus its datasets' images, videos and captions, which musubi reads only through its caches.

An edit of a caption or an image during a run reaches no attempt of musubi's, the next launch's
included: its caching scripts made the caches the trainer reads before the run, and only running
them again changes what it trains on. So such an edit is said once, on the console, with the caching
commands (each edited file is journaled as a ``warning``), instead of trainsup implying it applied.
An edit of the dataset TOML that changes what only the caching scripts read (resolution, bucketing,
caption extension, frames: ``caches.CACHE_BOUND``) is rejected with the same commands: applied without
re-caching, the run would train on the old caches under settings that say otherwise (its batch size
and repeats still apply). The user's cache directory is never touched, and sd-scripts' setting aside
of stale caches never runs here (musubi's caches are its own files, not sd-scripts' ``.npz``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...record import journalkinds as kinds
from ...record.journal import Journal
from ...record.textfmt import shown_path
from ...sensors.watch import FileWatcher
from ...trainers.base import EditAction, Plan, Settings
from ..kohya import tomlio
from ..kohya.caches import Subset
from ..kohya.inputs import KohyaInputs
from ..kohya.plan import LaunchPlan
from . import caches


class MusubiInputs(KohyaInputs):
    def __init__(self, plan: LaunchPlan, cwd: Path, run_dir: Path, settings: Settings,
                 journal: Journal, say: Callable[[str], None]) -> None:
        super().__init__(plan, cwd, run_dir, settings, journal, say)
        doc = self.dataset_doc if isinstance(self.dataset_doc, dict) else {}
        self.datasets = [d for d in caches.datasets(doc, cwd) if d.media_dir is not None]
        dataset_config = plan.value("dataset_config")
        self.commands = caches.caching_commands(plan.command, str(dataset_config)) if dataset_config else None
        self.stale: list[Path] = []  # media and captions edited since the run started, in order
        # What the user's caches were made from, as far as trainsup can tell: the dataset TOML at the start.
        self.latents_remade = caches.latent_models_known(plan.command)  # trainsup can run the latent caching
        self.cached_from: dict[str, Any] | None = copy.deepcopy(dict(doc)) if self.dataset_doc is not None else None

    def subsets(self) -> list[Subset]:
        return []  # no sd-scripts caches next to the images: nothing is ever set aside

    def watch(self, watcher: FileWatcher) -> None:
        super().watch(watcher)
        for ds in self.datasets:
            assert ds.media_dir is not None
            suffixes = caches.VIDEO_SUFFIXES if ds.video else caches.IMAGE_SUFFIXES
            exts = {*suffixes, *(s.upper() for s in suffixes), *((ds.caption_extension,) if ds.caption_extension
                                                                 else ())}
            watcher.watch_tree(ds.media_dir, sorted(exts))

    def owns(self, path: Path) -> bool:
        return super().owns(path) or caches.is_input(path, self.datasets)

    def on_change(self, path: Path, kind: str, plan: Plan | None = None) -> EditAction:
        if path not in self._files() and caches.is_input(path, self.datasets):
            self._cache_bound(path)
            return "none"
        return super().on_change(path, kind, plan)

    def _config_changed(self, path: Path, dataset: bool) -> EditAction:
        if dataset and isinstance(self.dataset_doc, dict):
            try:
                new = tomlio.read_toml(path)
            except tomlio.ConfigFileError:
                new = None  # sd-scripts' check rejects it with its line
            bound = caches.cache_bound_changes(self.dataset_doc, new) if new is not None else []
            if bound and all(b in caches.LATENT_BOUND for b in bound) and self.latents_remade:
                # trainsup makes those latents again itself, in the run dir, before the next launch
                self.say(f"{shown_path(path)}: {', '.join(bound)} changed: musubi-tuner's latents are made again "
                         "for it, into the run dir, before the next launch")
                return super()._config_changed(path, dataset)
            if bound:
                # Applied, it would train on the old caches under settings that say otherwise.
                return self.edits.reject(path, f"musubi-tuner trains on caches made with the old "
                                         f"{', '.join(bound)}; to change it, stop the run, {self.how_to_recache()} "
                                         "with the edited file, then start the run again", None)
        return super()._config_changed(path, dataset)

    def _cache_bound(self, path: Path) -> None:
        if path in self.stale:
            return
        self.stale.append(path)
        how = self.how_to_recache()
        fields = {"path": str(path), "reason": "stale_cache", "fix": how}  # the adapter's fields of a warning
        self.journal.event(kinds.WARNING, attempt=self.attempt, **fields,
                           message=f"{path.name} edited: musubi-tuner trains on its caches, made before the run; "
                                   "the edit applies only once they are made again")
        if len(self.stale) == 1:
            self.say(f"warning: {shown_path(path)} edited, but musubi-tuner trains only on its caches, made before "
                     f"this run: this run keeps training on the old caption/image (later edits too). To use them, "
                     f"stop the run and {how}, then run it again")

    def how_to_recache(self) -> str:
        if self.commands is None:
            return "run the model's caching scripts (*_cache_latents.py, *_cache_text_encoder_outputs.py) again"
        return f"run {self.commands[0]} and {self.commands[1]}"

