"""Owns reading the numbers a CUDA out-of-memory message carries, and what they rule out.

torch's message says how much it tried to allocate and where the memory went, in two shapes:

- torch 2.0 and later: ``Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of
  which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.02 GiB memory in use.
  [40.00 GiB allowed; ]Of the allocated memory 76.50 GiB is allocated by PyTorch, and 1.02 GiB is
  reserved by PyTorch but unallocated.`` (``allowed``: a per-process memory fraction is set);
- torch 1.x: ``Tried to allocate 20.00 MiB (GPU 0; 14.75 GiB total capacity; 13.53 GiB already
  allocated; 10.81 MiB free; 13.95 GiB reserved in total by PyTorch)``.

``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` undoes fragmentation: memory PyTorch reserved
but cannot hand out in one piece.  It can only help when that memory, with what the process may still
take, would have held the request: ``reserved but unallocated + headroom >= tried``, where the
headroom is the allowance left under a cap, else the device's free memory.  When the numbers say
otherwise, every adapter's OOM ladder skips that rung (see ``remedies.Rung``).

A rule whose pattern captures any of the numbers as named groups (``tried``, ``allocated``,
``unallocated``, ``free``, ``in_use``, ``allowed``; each a size with its unit, ``2.00 GiB``) is read by
its groups (``verdict.Said``); what no group gives is read from the message.  The built-in rule
captures none: its patterns recognise the message, whose numbers may follow on rows of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .verdict import Said

__all__ = ["OomNumbers", "fragmentation_ruled_out", "oom_numbers"]

_SIZE = r"(\d+(?:\.\d+)?)\s*(GiB|MiB|KiB|GB|MB|KB|bytes|B)\b"
_UNIT = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "GB": 1 << 30, "MB": 1 << 20, "KB": 1 << 10,
         "bytes": 1, "B": 1}
_TRIED = re.compile(r"Tried to allocate " + _SIZE)
_UNALLOCATED = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_FREE = re.compile(r"of which " + _SIZE + r" is free")
_IN_USE = re.compile(r"this process has " + _SIZE + r" memory in use")
_ALLOWED = re.compile(_SIZE + r" allowed;")
# torch 1.x: "(GPU 0; 14.75 GiB total capacity; 13.53 GiB already allocated; 10.81 MiB free; 13.95 GiB
# reserved in total by PyTorch)"
_OLD_ALLOCATED = re.compile(_SIZE + r" already allocated")
_OLD_FREE = re.compile(_SIZE + r" free;")
_OLD_RESERVED = re.compile(_SIZE + r" reserved in total by PyTorch")


@dataclass(frozen=True)
class OomNumbers:
    """What an OOM message says, in bytes (None: not in the message)."""

    tried: int | None
    allocated: int | None
    unallocated: int | None  # reserved by PyTorch but not handed out
    free: int | None  # free on the device
    in_use: int | None  # the process's use, non-PyTorch memory included
    allowed: int | None  # the process's cap (a memory fraction)

    def headroom(self) -> int | None:
        """What the process could still take: under a cap, the rest of its allowance; else the free memory."""
        if self.allowed is not None and self.in_use is not None:
            return max(0, self.allowed - self.in_use)
        return self.free


def _size(rx: re.Pattern[str], text: str) -> int | None:
    m = rx.search(text)
    return None if m is None else int(float(m.group(1)) * _UNIT[m.group(2)])


_GROUPS = ("tried", "allocated", "unallocated", "free", "in_use", "allowed")  # OomNumbers' fields
_WHOLE_SIZE = re.compile(_SIZE)


def _group_size(text: str | None) -> int | None:
    m = _WHOLE_SIZE.fullmatch(text.strip()) if text else None
    return None if m is None else int(float(m.group(1)) * _UNIT[m.group(2)])


def oom_numbers(evidence: Said) -> OomNumbers | None:
    """The numbers of the OOM message in ``evidence``, or None: each its rule's named group when it
    captured that number, else read from the line (rows joined: a wrapped message counts)."""
    parsed = _read(evidence.line)
    given = {name: size for name in _GROUPS if (size := _group_size(evidence.groups.get(name))) is not None}
    if not given:
        return parsed
    return replace(parsed or OomNumbers(None, None, None, None, None, None), **given)


def _read(evidence: str | None) -> OomNumbers | None:
    """The numbers read from the message's text (torch 2's shape or torch 1's), or None."""
    if not evidence or "Tried to allocate" not in evidence.replace("\n", " "):
        return None
    text = " ".join(row.strip() for row in evidence.split("\n"))
    unallocated = _size(_UNALLOCATED, text)
    allocated = _size(_ALLOCATED, text)
    free = _size(_FREE, text)
    if unallocated is None:
        old_alloc, old_reserved = _size(_OLD_ALLOCATED, text), _size(_OLD_RESERVED, text)
        if old_alloc is not None and old_reserved is not None:
            allocated, unallocated = old_alloc, max(0, old_reserved - old_alloc)
            free = _size(_OLD_FREE, text) if free is None else free
    return OomNumbers(_size(_TRIED, text), allocated, unallocated, free, _size(_IN_USE, text),
                      _size(_ALLOWED, text))


def _human(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"


def fragmentation_ruled_out(evidence: Said) -> str | None:
    """Why undoing fragmentation cannot help this OOM (a sentence), or None when it might or the
    message does not say."""
    numbers = oom_numbers(evidence)
    if numbers is None or numbers.tried is None or numbers.unallocated is None:
        return None
    headroom = numbers.headroom() or 0
    if numbers.unallocated + headroom >= numbers.tried:
        return None
    room = f" and {_human(headroom)} left to take" if headroom else ""
    return (f"only {_human(numbers.unallocated)} reserved but unallocated{room}, less than the "
            f"{_human(numbers.tried)} it tried to allocate: no fragmentation to undo")
