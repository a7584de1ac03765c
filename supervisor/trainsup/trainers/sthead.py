"""Owns reading a safetensors file's header: tensor names, dtypes, shapes and data offsets.

The format is an 8-byte little-endian header length, a JSON object (at most 100 MiB by the format's
own limit) mapping tensor names to ``{"dtype", "shape", "data_offsets"}`` plus an optional
``__metadata__``, then the raw tensor bytes.  Only the header is read: no tensor is loaded, and
neither torch nor the safetensors library is needed.
"""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MAX_HEADER", "Header", "HeaderError", "Tensor", "float8_dtypes", "load_header", "read_header"]

MAX_HEADER = 100 * 1024 * 1024


class HeaderError(ValueError):
    """The file is not a readable safetensors file; the message says why (without the path)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # the format's spelling: F32, BF16, F8_E4M3, ...
    shape: tuple[int, ...]
    end: int  # end of its data, relative to the end of the header

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    entries: dict[str, Any]  # the JSON object as stored, ``__metadata__`` included
    length: int  # bytes of JSON after the 8-byte length
    size: int  # bytes in the file

    def tensors(self) -> list[Tensor]:
        """The tensors.  Raises HeaderError for an entry without a valid layout."""
        out = []
        for name, info in self.entries.items():
            if name == "__metadata__":
                continue
            try:
                shape = tuple(int(d) for d in info["shape"])
                out.append(Tensor(name, str(info["dtype"]), shape, int(info["data_offsets"][1])))
            except (KeyError, TypeError, ValueError, IndexError):
                raise HeaderError(f"tensor {name!r} has no valid dtype, shape and data_offsets") from None
        return out

    def missing_bytes(self) -> int:
        """How many bytes the tensors need beyond the end of the file (0 for a whole file)."""
        end = max((t.end for t in self.tensors()), default=0)
        return max(0, 8 + self.length + end - self.size)


def load_header(path: Path) -> Header:
    """Read ``path``'s header.  Raises OSError when the file cannot be read and HeaderError
    when it is not safetensors (or is cut short before its header ends)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        head = fh.read(8)
        if len(head) < 8:
            raise HeaderError("truncated (no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise HeaderError(f"header length {n} does not fit a {size}-byte file")
        raw = fh.read(n)
    try:
        entries = json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError included
        raise HeaderError(f"unreadable header ({exc})") from None
    if not isinstance(entries, dict):
        raise HeaderError("header is not a JSON object")
    return Header(entries, n, size)


def read_header(path: Path) -> dict[str, Any]:
    """The parsed JSON header of ``path`` (see ``load_header`` for the errors)."""
    return load_header(path).entries


def float8_dtypes(header: Header) -> Counter[str]:
    """How many tensors of each float8 dtype (``F8_E4M3``, ``F8_E5M2``, ...) the file holds."""
    return Counter(t.dtype for t in header.tensors() if t.dtype.upper().startswith("F8"))
