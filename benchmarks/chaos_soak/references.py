"""Reference runs: the final weights of uninterrupted demo runs (no trainsup, no pacing), which
invariant 1 compares a finished run's weights with; cached by their caption schedule."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .params import child_env, demo_argv


class References:
    """Plain demo runs (no trainsup, no pacing), cached by their caption schedule: a list of
    (start step, dataset dir) segments, each resumed from the previous segment's state."""

    def __init__(self, work: Path, assets: dict[str, Path]) -> None:
        self.work, self.assets = work, assets
        self.cache: dict[tuple[tuple[int, str], ...], Path] = {}
        self.runs = 0

    def weights(self, schedule: list[tuple[int, Path]]) -> Path:
        return self._out(schedule) / "lora.safetensors"

    def _out(self, schedule: list[tuple[int, Path]]) -> Path:
        key = tuple((step, str(dataset)) for step, dataset in schedule)
        if key in self.cache:
            return self.cache[key]
        extra: list[str] = []
        before = self._out(schedule[:-1]) if len(schedule) > 1 else None  # first: it names its own dir
        out = self.work / "refs" / f"ref{len(self.cache):03d}"
        if before is not None:
            start = schedule[-1][0]
            # kohya labels the saves after a resume from `prev` with step - prev (prev: whole epochs here)
            label = start - schedule[-2][0]
            extra = ["--resume", str(before / f"lora-step{label:08d}-state"), "--skip_until_initial_step",
                     "--initial_step", str(start)]
        argv = demo_argv(self.assets, schedule[-1][1], self.assets["prompts"], out, *extra)
        done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=600, check=False)
        self.runs += 1
        if done.returncode != 0:
            raise RuntimeError(f"reference run failed ({done.returncode}): {done.stderr[-2000:]}")
        self.cache[key] = out
        return out
