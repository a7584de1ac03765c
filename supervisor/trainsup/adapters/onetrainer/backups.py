"""Owns one OneTrainer backup directory: its name, and whether it is complete and sound, read
without torch.

A backup is ``WORKSPACE/backup/<YYYY-MM-DD_HH-MM-SS>-backup-<global_step>-<epoch>-<epoch_step>/``.
OneTrainer writes, in this order and with no fsync: ``lora/lora.safetensors`` (LoRA runs; through a
temporary file and a rename), ``optimizer/optimizer.pt`` (in place), ``meta.json``,
``onetrainer_config/args.json``, then ``concepts.json`` and ``samples.json`` (``shutil.copy2``, so
they keep their source's old mtime). Complete means every file is there, each JSON file parses,
the safetensors header reads, its tensors' bytes are all in the file and every float is finite
(numpy over the raw bytes; no safetensors library or torch needed), and ``optimizer.pt``, a
``torch.save`` zip archive, passes ``zipfile.testzip`` (every member's CRC).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ...trainers.sthead import HeaderError, load_header
from ..litgpt.states import weights_problem

NAME = re.compile(r"^(?P<ts>\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})-backup-(?P<step>\d+)-(?P<epoch>\d+)-(?P<estep>\d+)$")
JSON_FILES = ("meta.json", "onetrainer_config/args.json", "onetrainer_config/concepts.json",
              "onetrainer_config/samples.json")
LORA = "lora/lora.safetensors"
OPTIMIZER = "optimizer/optimizer.pt"


@dataclass(frozen=True)
class BackupName:
    step: int
    epoch: int
    epoch_step: int


def parse_name(name: str) -> BackupName | None:
    m = NAME.match(name)
    return None if m is None else BackupName(int(m["step"]), int(m["epoch"]), int(m["estep"]))


def json_problem(path: Path) -> str:
    try:
        json.loads(path.read_bytes())
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    except ValueError as exc:
        return f"not valid JSON ({exc})"
    return ""


def safetensors_problem(path: Path) -> str:
    """'' when the safetensors file is whole and every floating tensor finite."""
    try:
        header = load_header(path)
        tensors = header.tensors()
        missing = header.missing_bytes()
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    except HeaderError as exc:
        return str(exc)
    if missing:
        return f"cut short: {missing} bytes of tensor data missing"
    try:
        import numpy as np
    except ImportError:
        return ""  # cannot look at the values here; the header is whole
    dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16}
    data = path.read_bytes()[8 + header.length:]
    for t in sorted(tensors, key=lambda t: t.end):
        begin = int(header.entries[t.name]["data_offsets"][0])
        chunk = data[begin:t.end]
        if t.dtype in dtypes:
            values = np.frombuffer(chunk, dtype=dtypes[t.dtype])
            if not np.isfinite(values).all():
                return f"tensor {t.name} holds NaN or inf"
        elif t.dtype == "BF16":
            bits = np.frombuffer(chunk, dtype=np.uint16)
            if ((bits & 0x7F80) == 0x7F80).any():
                return f"tensor {t.name} holds NaN or inf"
    return ""


def backup_problem(path: Path, lora: bool = True) -> str:
    """'' when the backup directory is complete and sound, else what is wrong (the first thing)."""
    if not path.is_dir():
        return "missing"
    for rel in JSON_FILES:
        problem = json_problem(path / rel)
        if problem:
            return f"{rel} {problem}"
    if lora:
        problem = safetensors_problem(path / LORA)
        if problem:
            return f"{LORA} {problem}"
    opt = path / OPTIMIZER
    if not opt.exists():
        return f"{OPTIMIZER} missing"
    problem = weights_problem(opt)
    return f"{OPTIMIZER}: {problem}" if problem else ""


def backup_args(path: Path) -> dict[str, object]:
    """The config the run that wrote the backup ran with (``onetrainer_config/args.json``)."""
    try:
        doc = json.loads((path / "onetrainer_config" / "args.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
