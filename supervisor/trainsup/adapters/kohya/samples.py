"""Owns sd-scripts' sample images across attempts: the names and steps an uninterrupted run gives them.

sd-scripts writes ``OUTPUT_DIR/sample/[NAME_]STEP6_II_TIMESTAMP[_SEED].png`` (II: the prompt's
place in the prompt file; an epoch's samples ``eEPOCH6``, ``--sample_at_first``'s ``e000000``), with
the step it counts: after a resume, the attempt's own label. musubi-tuner's are the same, with the
grid index after the seed (``..._SEED_000.png``), and a video model's are ``.mp4`` files (no index).
An attempt that writes under its own ``NAME-trainsupN`` name (see ``adapter``) has each complete sample
that the user's sample cadence asks for published under the user's name and its true step, a hard link
(the timestamp and seed kept), and never over a sample of the same step and prompt this run already
shows; then the attempt's file is moved into ``RUN_DIR/saves/samples/`` (journal ``sample_published``,
``sample_hidden``), whatever it was. A sample still being written is left until it is complete, or until its
attempt has ended.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...record.fsutil import move_into

# musubi-tuner's image samples add the image's index in the grid (``_000``) after the seed.
_NAME = re.compile(r"^(?P<epoch>e?)(?P<number>\d{6})_(?P<index>\d{2})(?P<tail>(?:_\d{14})?(?:_\d+)?(?:_\d{3})?)"
                   r"\.(?P<ext>png|mp4)$")
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk, the last bytes of every PNG


@dataclass(frozen=True)
class SampleName:
    """A sample file's name, read: step or epoch, number, prompt index, and what follows them."""

    epoch: bool
    number: int
    index: int
    tail: str  # ``_TIMESTAMP[_SEED]``
    ext: str = "png"  # ``mp4``: a video model's sample (musubi-tuner)

    def key(self) -> tuple[bool, int, int]:
        return self.epoch, self.number, self.index

    def named(self, output_name: str | None, number: int) -> str:
        prefix = f"{output_name}_" if output_name else ""
        return f"{prefix}{'e' if self.epoch else ''}{number:06d}_{self.index:02d}{self.tail}.{self.ext}"


def parse(name: str, output_name: str | None) -> SampleName | None:
    """The sample name of a file that ``output_name`` wrote; None for any other file."""
    prefix = f"{output_name}_" if output_name else ""
    m = _NAME.match(name[len(prefix):]) if name.startswith(prefix) else None
    if m is None:
        return None
    return SampleName(m.group("epoch") == "e", int(m.group("number")), int(m.group("index")), m.group("tail"),
                      m.group("ext"))


def complete_png(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(-len(_PNG_END), os.SEEK_END)
            return f.read() == _PNG_END
    except OSError:
        return False


def complete_mp4(path: Path) -> bool:
    """Whether an MP4's top-level boxes (4-byte size, 4-byte type; size 1: a 64-bit size follows; 0: to
    the end) tile the file exactly and hold its index (``moov``) and its media (``mdat``): a file cut
    while written fails one or the other."""
    seen: set[bytes] = set()
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            at = 0
            while at < end:
                f.seek(at)
                head = f.read(16)
                if len(head) < 8:
                    return False
                size, kind = int.from_bytes(head[:4], "big"), head[4:8]
                if size == 1:
                    if len(head) < 16:
                        return False
                    size = int.from_bytes(head[8:16], "big")
                elif size == 0:
                    size = end - at
                if size < 8 or at + size > end:
                    return False
                seen.add(kind)
                at += size
    except OSError:
        return False
    return {b"moov", b"mdat"} <= seen


def complete(path: Path, sample: SampleName) -> bool:
    return complete_mp4(path) if sample.ext == "mp4" else complete_png(path)


@dataclass(frozen=True)
class SampleCadence:
    """When the user's command samples: what an uninterrupted run shows."""

    every_steps: int | None
    every_epochs: int | None  # sd-scripts then ignores --sample_every_n_steps
    at_first: bool  # --sample_at_first: ``e000000`` before training
    max_steps: int

    def wants(self, sample: SampleName, number: int) -> bool:
        if sample.epoch:
            return self.at_first if number == 0 else self.wants_epoch(number)
        every = None if self.every_epochs else self.every_steps
        return every is not None and 0 < number <= self.max_steps and number % every == 0

    def wants_epoch(self, epoch: int) -> bool:
        every = self.every_epochs
        return every is not None and epoch > 0 and epoch % every == 0


class SampleShelf:
    """Publishes and hides one run's sample images (one per run)."""

    def __init__(self, folder: Path, run_dir: Path, user_name: str | None, cadence: SampleCadence,
                 run_started: float, event: Callable[..., object]) -> None:
        self.folder, self.hidden = folder, run_dir / "saves" / "samples"
        self.user_name, self.cadence = user_name, cadence
        self.run_started = run_started  # files older than the run are another run's
        self.event = event  # the journal's

    def _ours(self, path: Path) -> bool:
        try:
            return path.stat().st_mtime >= int(self.run_started)
        except OSError:
            return False

    def shown(self) -> set[tuple[bool, int, int]]:
        """(epoch?, true number, prompt index) of every sample this run shows under the user's name."""
        found = set()
        for path in self.folder.glob("*_*"):
            name = parse(path.name, self.user_name)
            if name is not None and self._ours(path):
                found.add(name.key())
        return found

    def steps_shown(self) -> frozenset[int]:
        return frozenset(number for epoch, number, _ in self.shown() if not epoch)

    def settle(self, output_name: str | None, offset: int | None, ended: bool) -> None:
        """Publish or hide what an attempt wrote under ``output_name`` (its labels run ``offset``
        behind; None: not known yet); ``ended``: its trainer is gone, a cut file is final."""
        if output_name == self.user_name:
            return  # its names are true already
        shown: set[tuple[bool, int, int]] | None = None
        for path in sorted(self.folder.glob(f"{glob.escape(output_name or '')}_*")):
            sample = parse(path.name, output_name)
            if sample is None:
                continue
            whole = complete(path, sample)
            if not ended and (not whole or (offset is None and not sample.epoch)):
                continue  # still being written, or its true step is not known yet: look again later
            number = sample.number if sample.epoch else sample.number + (offset or 0)
            if whole and (sample.epoch or offset is not None) and self.cadence.wants(sample, number):
                shown = self.shown() if shown is None else shown
                if (sample.epoch, number, sample.index) not in shown and self._publish(path, sample, number):
                    shown.add((sample.epoch, number, sample.index))
            self._hide(path, "a sample under an attempt's own name" if whole else "cut short")

    def _publish(self, path: Path, sample: SampleName, number: int) -> bool:
        dst = self.folder / sample.named(self.user_name, number)
        try:
            os.link(path, dst)  # never over a file: a link fails where the name is taken
        except FileExistsError:
            return False
        except OSError:
            if dst.exists():
                return False
            shutil.copy2(path, dst)
        self.event("sample_published", src=str(path), dst=str(dst),
                   **({"epoch": number} if sample.epoch else {"step": number}))
        return True

    def _hide(self, path: Path, why: str) -> None:
        try:
            target = move_into(path, self.hidden)
        except OSError:
            return  # gone meanwhile (the user's own tidying): nothing to hide
        self.event("sample_hidden", file=str(path), to=str(target), why=why)
