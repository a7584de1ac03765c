"""Owns the hang clock: whether the trainer still makes progress, and how long it may go without.

Progress is a bar that advances: the ``steps`` bar (a new step), a caching, loading or sampling bar
(a new redraw), and, while a sampling pass or a state/checkpoint save is under way, every line it
prints. Other lines never reset the clock: a warning that a stuck NCCL watchdog repeats every minute
is not progress. How long the trainer may go without progress depends on where it is:

- before the first trained step: ``startup_timeout_s`` (a 23 GB base model from a slow disk, latents
  cached for thousands of images);
- training: ``max(min_timeout_s, step_factor x the 95th percentile of observed step times)``, the
  start-up timeout until a step time was observed (steps that included a sampling pass or a save
  do not count: their time is the phase's);
- sampling and saving: ``phase_timeout_s``, renewed by every line the phase prints;
- finishing, once the ``steps`` bar reached its total: ``phase_timeout_s`` (the final weights written,
  a last evaluation, the ranks' teardown: seen, a rank 0 of TRL's two gloo ranks 8 s and more in its
  exit after rank 1 had ended, printing nothing).

``timeout_s`` set fixes one timeout for every phase. Pure: callers pass the time.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PHASES = ("startup", "training", "sampling", "saving", "finishing")


@dataclass(frozen=True)
class HangPolicy:
    startup_timeout_s: float = 1800.0
    min_timeout_s: float = 300.0
    step_factor: float = 10.0
    phase_timeout_s: float = 1800.0
    timeout_s: float | None = None  # one timeout for every phase


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank method."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class HangClock:
    """Fed by the decision loop with what the output showed; says when the trainer is overdue."""

    def __init__(self, policy: HangPolicy, now: float) -> None:
        self.policy = policy
        self.phase = "startup"
        self.last_progress = now
        self.last_line = ""
        self._step: int | None = None
        self._step_at: float | None = None
        self._step_times: deque[float] = deque(maxlen=512)

    @property
    def step(self) -> int | None:
        """The last step the ``steps`` bar showed."""
        return self._step

    def on_step(self, step: int, now: float, line: str = "", total: int | None = None) -> None:
        """The ``steps`` bar showed ``step`` (of ``total``, where known); a new step is progress and ends a
        sampling or saving phase; the last one begins the finishing phase."""
        if self._step is not None and step == self._step:
            return  # a redraw of the same step (a postfix update, the bar closing) is not progress
        if self.phase == "training" and self._step_at is not None and self._step is not None and step > self._step:
            # steps that included a sampling pass or a save (or start-up) say nothing of step time
            self._step_times.append((now - self._step_at) / (step - self._step))
        self._step, self._step_at = step, now
        self.phase = "finishing" if total and step >= total else "training" if step > 0 else self.phase
        self._progress(now, line)

    def on_activity(self, now: float, line: str = "") -> None:
        """Another bar advanced (caching, loading, sampling): progress, whatever the phase."""
        self._progress(now, line)

    def enter(self, phase: str, now: float, line: str = "") -> None:
        """A sampling pass or a save began (``sampling`` / ``saving``)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        self.phase = phase
        self._progress(now, line)

    def timeout(self) -> float:
        p = self.policy
        if p.timeout_s is not None:
            return p.timeout_s
        if self.phase in ("sampling", "saving", "finishing"):
            return p.phase_timeout_s
        if self.phase == "startup" or len(self._step_times) < 1:
            return p.startup_timeout_s
        return max(p.min_timeout_s, p.step_factor * percentile(list(self._step_times), 0.95))

    def overdue(self, now: float) -> float | None:
        """Seconds without progress when that exceeds the timeout, else None."""
        idle = now - self.last_progress
        return idle if idle > self.timeout() else None

    def _progress(self, now: float, line: str) -> None:
        self.last_progress = now
        if line:
            self.last_line = line


def hang_evidence(idle_s: float, clock: HangClock, step: int | None, frames: list[str], dataloader: bool,
                  gpu: str | None = None) -> str:
    """The one-line evidence of a hang: how long, where (absolute step, innermost frames), what last
    moved, and the GPUs' utilisation when known (a hint, never the trigger)."""
    where = _where(step)
    inner = "; ".join(frames) if frames else "no stacks"
    wait = " (the stacks show DataLoader waits)" if dataloader else ""
    busy = f"; {gpu}" if gpu else ""
    return (f"no progress for {idle_s:.0f} s {where} (timeout {clock.timeout():.0f} s, {clock.phase}); "
            f"innermost frames: {inner}{wait}; last progress: {clock.last_line.strip()[:200]!r}{busy}")


def _where(step: int | None) -> str:
    return f"at step {step}" if step is not None else "before the first step"


def hang_groups(step: int | None, frames: Sequence[str]) -> dict[str, str]:
    """The named groups a hang's evidence carries (``Evidence.groups``): its ``spot`` (step and innermost
    frames) when stacks were taken; without stacks there is no spot to recur at."""
    return {"spot": f"{_where(step)}, {'; '.join(frames)}"} if frames else {}


_SPOT = re.compile(r"(at step \d+|before the first step) .*?; innermost frames: (.*?)(?: \(the stacks|; last progress)")


def hang_spot(evidence: str | None, groups: Mapping[str, str] | None = None) -> str | None:
    """Where a hang stood (step and innermost frames), to tell whether it recurs at the same spot: the
    evidence's ``spot`` group (see ``hang_groups``), else read from its line (a journal's evidence)."""
    if groups and "spot" in groups:
        return groups["spot"]
    m = _SPOT.search(evidence or "")
    return None if m is None or m.group(2) == "no stacks" else f"{m.group(1)}, {m.group(2)}"
