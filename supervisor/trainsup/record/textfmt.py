"""Owns how trainsup words a duration, a size and a run's progress, the same on every surface:
``trainsup status``, systemd's ``Status:`` line (``run.sdnotify``), notifications (``service.notices``),
``trainsup doctor`` and the adapters' doctor checks.

``format_duration`` gives ``42s``, ``16m56s``, ``3h02m``, ``2d03h``; ``progress_parts`` gives
``step 1240/2000``, ``loss 0.0912``, ``1.85 it/s``, ``eta 6m51s`` (each part only when known), which
the caller joins with its own separator. Both take the values as a status snapshot holds them
(JSON), so anything that is not a number is unknown. ``format_size`` gives ``28.9 KiB``, ``77.6 GiB``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["eta_seconds", "format_duration", "format_size", "progress_parts", "shown_path"]


def format_duration(seconds: float) -> str:
    """``42s``, ``16m56s``, ``3h02m``, ``2d03h``: two units at most, as a glance needs."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_size(n: float) -> str:
    """``77.6 GiB``, ``28.9 KiB``, ``512 B``: binary units, one decimal."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def eta_seconds(step: object, total: object, rate: object) -> float | None:
    """Seconds left at ``rate`` steps a second; ``None`` when any of them is unknown or meaningless."""
    s, t, r = _number(step), _number(total), _number(rate)
    if s is None or t is None or r is None or not math.isfinite(r) or r <= 0:
        return None
    return max(t - s, 0) / r


def progress_parts(step: object, total: object, loss: object, rate: object, *,
                   eta_s: float | None) -> list[str]:
    """``["step 1240/2000", "loss 0.0912", "1.85 it/s", "eta 6m51s"]``, leaving out what is not
    known: no total gives ``step 1240``; a speed only when it is above 0; the ETA only when given
    (``eta_seconds`` of the same values, where the caller deems the speed current)."""
    parts = []
    s, t, lo, r = _number(step), _number(total), _number(loss), _number(rate)
    if s is not None:
        parts.append(f"step {s}/{t}" if t else f"step {s}")
    if lo is not None:
        parts.append(f"loss {lo:.4g}")
    if r is not None and math.isfinite(r) and r > 0:
        parts.append(f"{r:.3g} it/s")
    if eta_s is not None:
        parts.append(f"eta {format_duration(eta_s)}")
    return parts


def _number(value: object) -> int | float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def shown_path(path: str | Path, cwd: Path | None = None, home: Path | None = None) -> str:
    """A path as a person reads it: relative to ``cwd`` when under it (``out/.trainsup``), else
    under ``~`` when in the home directory (``~/lora/out``), else as it is."""
    p = Path(path)
    if not p.is_absolute():
        return str(p)
    try:
        here = cwd if cwd is not None else Path.cwd()
    except OSError:  # the working directory was removed
        here = None
    if here is not None and here != Path(here.anchor) and p.is_relative_to(here) and p != here:
        return str(p.relative_to(here))
    home = home if home is not None else Path(os.path.expanduser("~"))
    if p.is_relative_to(home) and p != home and str(home) != "/":
        return str(Path("~") / p.relative_to(home))
    return str(p)
