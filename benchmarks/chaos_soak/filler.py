"""The full disk of `disk_full`: `fill` takes all but a given number of bytes of the output dir's tmpfs
in one filler file, and `TopUp`, for the `journal` moment, keeps it full while the injection lasts:
another writer on the same disk that takes each page freed (one a millisecond, so a reserve trainsup
frees is not all gone before trainsup's next write), as a job beside the run would."""

from __future__ import annotations

import os
import threading
from pathlib import Path

PAGE = 4096


def fill(out: Path, filler: Path, free_bytes: int) -> None:
    st = os.statvfs(out)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as fh:
        try:
            fh.write(b"\0" * max(free - free_bytes, 0))
        except OSError:
            pass  # the trainer took some meanwhile: full all the same


class TopUp(threading.Thread):
    """Appends a page to the filler every millisecond that finds room, until `halt` is set."""

    def __init__(self, filler: Path) -> None:
        super().__init__(name="chaos-topup", daemon=True)
        self.filler = filler
        self.halt = threading.Event()
        self.taken = 0  # bytes it took back

    def run(self) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_APPEND)
        try:
            while not self.halt.wait(0.001):
                try:
                    self.taken += os.write(fd, b"\0" * PAGE)
                except OSError:
                    continue  # full: the usual case
        finally:
            os.close(fd)

    def stop(self) -> None:
        self.halt.set()
        self.join()
