"""Owns LitGPT's saved states: the ``step-NNNNNN/`` folders of the out dirs of a run, when one is
complete, which may be resumed from, where each attempt writes, and publishing ``final/``.

A run writes into the command's ``--out_dir`` (OUT) while nothing there would be overwritten; an
attempt that starts from the beginning when OUT already holds step folders or ``final/`` (an earlier
attempt's, which LitGPT would overwrite in place, file by file) writes into ``RUN_DIR/attempt-N-out``
instead, and its ``final/`` is published to ``OUT/final`` at the end when that does not exist. A
resumed attempt continues in the out dir that holds its state.

Complete means: the file the save writes last is there (``prompt_style.yaml``; pretrain's
``model_config.yaml``) and the weights file is non-empty and reads as a whole. The supervisor must
not import torch, and a ``torch.save`` file is a zip archive, so ``zipfile.ZipFile.testzip`` stands
in for ``torch.load``: it reads every member and checks its CRC (a truncated file has no central
directory; a damaged one fails a CRC). Verdicts are cached per file size and mtime: a full model's
state is large, and ``newest`` asks again before every launch.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from ...record.fsutil import link_or_copy, move_into
from ...record.journal import Journal
from ...record.ledger import Ledger, StateRecord
from ...record.textfmt import shown_path
from ...trainers.base import Plan
from ...trainers.stepstates import StepStates, newest_mtime, step_dirs
from .methods import Method

_STEP_DIR = re.compile(r"^step-(\d+)$")


def weights_problem(path: Path) -> str:
    """'' when the torch.save zip archive at ``path`` reads whole, else what is wrong with it."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path.name} missing"
    except OSError as exc:
        return f"{path.name} unreadable: {exc.strerror or exc}"
    if size == 0:
        return f"{path.name} is empty (the save was cut short)"
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except zipfile.BadZipFile as exc:
        return f"{path.name} is not a whole torch.save archive ({exc})"
    except (OSError, EOFError, ValueError) as exc:
        return f"{path.name} cannot be read: {exc}"
    return f"{path.name}: member {bad} fails its CRC" if bad is not None else ""


def state_problem(path: Path, method: Method, cache: dict[Path, tuple[int, int, str]] | None = None) -> str:
    """'' when the step folder is complete, else why not (``cache``: verdicts on weights files)."""
    if not path.is_dir():
        return "missing"
    if not (path / method.marker).is_file():
        return f"{method.marker} missing (the save did not finish)"
    weights = path / method.weights
    try:
        st = weights.stat()
    except OSError:
        return f"{method.weights} missing"
    cached = cache.get(weights) if cache is not None else None
    if cached is not None and cached[:2] == (st.st_size, st.st_mtime_ns):
        return cached[2]
    verdict = weights_problem(weights)
    if cache is not None:
        cache[weights] = (st.st_size, st.st_mtime_ns, verdict)
    return verdict


def step_folders(base: Path) -> list[tuple[Path, int]]:
    """The ``step-N`` folders directly in ``base``, by step."""
    return step_dirs(base, _STEP_DIR)


class LitStates(StepStates):
    """StepStates over OUT and the run's own out dirs, with LitGPT's completeness check."""

    def __init__(self, ledger: Ledger, journal: Journal, say: Callable[[str], None], method: Method,
                 out: Path, run_dir: Path, resumable: Callable[[StateRecord, Plan | None], bool]) -> None:
        super().__init__(ledger, journal, say, self._find, self._check, final=self._final, publish=self._publish)
        self.method, self.out, self.run_dir = method, out, run_dir
        self.current_out = out  # where the running attempt writes
        self.adapter_allows = resumable  # the adapter's say on a state (its LR schedule, its method)
        self._verdicts: dict[Path, tuple[int, int, str]] = {}

    # --- where states are ----------------------------------------------------------------------
    def out_dirs(self) -> list[Path]:
        own = sorted(self.run_dir.glob("attempt-*-out"), key=lambda p: _attempt_no(p.name))
        return [self.out, *own]

    def attempt_out(self, attempt: int) -> Path:
        return self.run_dir / f"attempt-{attempt}-out"

    def _find(self) -> list[tuple[Path, int]]:
        found = [f for base in self.out_dirs() for f in step_folders(base)]
        return sorted(found, key=lambda f: f[1])

    def clear(self, base: Path) -> bool:
        """Whether an attempt starting from the beginning may write into ``base``: no step folder
        and no ``final/`` there that LitGPT would write over (and, for adapter_v2, no adapter file
        anywhere below, which its fresh start would take its first step number from)."""
        if (base / "final").exists() or step_folders(base):
            return False
        if self.method.subcommand == "finetune_adapter_v2":
            return next(base.rglob("step-*/*.pth.adapter_v2"), None) is None
        return True

    # --- completeness --------------------------------------------------------------------------
    def _check(self, path: Path) -> str:
        return state_problem(path, self.method, self._verdicts)

    def resumable(self, state: StateRecord, max_steps: int | None, plan: Plan | None = None) -> bool:
        """Only states the adapter calls resumable for ``plan`` (its LR schedule, its method); none at
        all for a method that cannot resume: every restart of it starts from the beginning."""
        return (self.method.resume != "none" and self.adapter_allows(state, plan)
                and super().resumable(state, max_steps, plan))

    # --- final ---------------------------------------------------------------------------------
    def _final(self) -> Path | None:
        return self.current_out / "final"

    def _publish_steps(self) -> None:
        """An attempt that started over elsewhere: publish its step folders that ``OUT`` lacks (their
        names are true steps), so ``OUT`` lists what an uninterrupted run writes. A folder of this
        run left incomplete there (a trainer killed mid-save) is moved aside first; nothing else is
        ever replaced."""
        started = self.ledger.run_started() or 0.0
        for src, _step in step_folders(self.current_out):
            dst = self.out / src.name
            if dst.exists():
                if not self._check(dst) or newest_mtime(dst) < int(started):
                    continue  # complete (the same step of the same run), or not this run's
                aside = move_into(dst, self.run_dir / "set-aside" / f"attempt-{self.attempt}")
                self.journal.event("state_set_aside", dir=str(dst), to=str(aside), attempt=self.attempt,
                                   why="incomplete: replaced by a complete save")
            try:
                _link_tree(src, dst)
            except OSError as exc:
                self.say(f"warning: cannot publish {src} to {dst}: {exc.strerror or exc}")
                continue
            self.journal.event("save_published", src=str(src), dst=str(dst))

    def _publish(self) -> str | None:
        """Put the attempt's ``final/`` at ``OUT/final`` when it was written elsewhere (hard links:
        no copy of the weights; the attempt's own folder stays whole). Never over an existing one."""
        src, dst = self.current_out / "final", self.out / "final"
        if not src.is_dir():
            return None
        if src == dst:
            return str(dst)
        self._publish_steps()
        if dst.exists():
            self.say(f"warning: {dst} exists and is not this run's; the final weights stay in {src}")
            self.journal.event("final_not_published", src=str(src), dst=str(dst), reason="exists")
            return str(src)
        try:
            _link_tree(src, dst)
        except OSError as exc:
            self.say(f"warning: cannot publish {src} to {dst}: {exc.strerror or exc}; the final weights are in {src}")
            return str(src)
        self.journal.event("final_published", src=str(src), dst=str(dst))
        self.say(f"the final weights are published at {shown_path(dst)} (from {shown_path(src)})")
        return str(dst)


def _attempt_no(name: str) -> int:
    m = re.match(r"attempt-(\d+)-out$", name)
    return int(m.group(1)) if m else 0


def _link_tree(src: Path, dst: Path) -> None:
    """Build ``dst`` beside itself from hard links (copies across file systems), then rename it into
    place, so ``OUT/final`` appears whole or not at all."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".final.", dir=dst.parent))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True, copy_function=link_or_copy)
        os.rename(tmp, dst)  # fails, leaving dst alone, if something made it meanwhile (non-empty)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # only our own temporary links and copies
        raise


