"""A fault shim and a seed pin for the real-OneTrainer tier, loaded only when this directory is on
PYTHONPATH.

``TRAINSUP_OT_SEED=N`` seeds torch's default generator when the interpreter starts. OneTrainer seeds
nothing globally, so two uninterrupted runs start from different LoRA weights and no run can be
compared with "the same run, uninterrupted"; with the seed pinned in both, it can. The pin does not
touch a resume: a resumed OneTrainer loads its weights, optimizer and progress from the backup.

It injects the device-mismatch seed fault at the real place: OneTrainer's training step calls
``model_setup.predict``; once ``TRAINSUP_OT_FAULT_STEP`` optimizer steps are done, and only while
the config the run was started with has ``latent_caching`` on, that call raises the RuntimeError
torch raises for tensors on two devices. The patch is made by an import hook on
``modules.trainer.GenericTrainer`` (wrapping methods of the loaded module); nothing of OneTrainer
is copied here.

``TRAINSUP_OT_SLOW_OPTIMIZER_SAVE_S=S`` holds OneTrainer for S seconds after it writes a backup's
``optimizer.pt`` (before its ``meta.json``), so a test that kills it inside a backup finds that moment
on loaded cores too; it changes no byte OneTrainer writes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

TARGET = "modules.trainer.GenericTrainer"
STEP = int(os.environ.get("TRAINSUP_OT_FAULT_STEP", "6"))
MESSAGE = ("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")


def _patch(module: types.ModuleType) -> None:
    cls = module.GenericTrainer
    original_start = cls.start

    def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_start(self, *args, **kwargs)
        predict = self.model_setup.predict

        def predict_on_two_devices(model: Any, batch: Any, config: Any, progress: Any, *a: Any, **k: Any) -> Any:
            if config.latent_caching and progress.global_step >= STEP:
                raise RuntimeError(MESSAGE)
            return predict(model, batch, config, progress, *a, **k)

        self.model_setup.predict = predict_on_two_devices
        return result

    cls.start = start


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


if os.environ.get("TRAINSUP_OT_FAULT") == "device_mismatch":
    sys.meta_path.insert(0, _Finder())

if os.environ.get("TRAINSUP_OT_SEED"):
    import torch

    torch.manual_seed(int(os.environ["TRAINSUP_OT_SEED"]))

if os.environ.get("TRAINSUP_OT_SLOW_OPTIMIZER_SAVE_S"):
    import time

    import torch

    _pause = float(os.environ["TRAINSUP_OT_SLOW_OPTIMIZER_SAVE_S"])
    _save = torch.save

    def _slow_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        result = _save(obj, f, *args, **kwargs)
        if str(f).endswith("optimizer.pt"):
            time.sleep(_pause)  # the backup is half written now: optimizer.pt there, meta.json not yet
        return result

    torch.save = _slow_save
