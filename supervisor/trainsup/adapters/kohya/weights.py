"""Owns reading tensor values from a weights file when a decision needs them (NaN checks).

Uses the safetensors library with numpy; never torch. Without numpy the check answers "unknown"
(False), and the caller falls back on step numbers alone.
"""

from __future__ import annotations

from pathlib import Path


def has_non_finite(path: Path) -> bool:
    try:
        import numpy as np
        from safetensors import safe_open
    except ImportError:
        return False
    try:
        with safe_open(str(path), framework="numpy") as fh:
            for key in fh.keys():  # noqa: SIM118 - a safetensors handle, not a dict
                try:
                    tensor = fh.get_tensor(key)
                except Exception:  # noqa: BLE001, S112 - dtypes numpy lacks (bf16, float8)
                    continue  # cannot be checked here; the rest of the file still is
                if tensor.dtype.kind == "f" and not np.isfinite(tensor).all():
                    return True
    except Exception:  # noqa: BLE001
        return False  # an unreadable file is the state validator's business, not this check's
    return False
