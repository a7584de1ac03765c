"""Console output that looks like sd-scripts': rich-style log records and a tqdm-style bar.

Owns the demo's log format (rich's RichHandler layout: time, level, message
column wrapped to the console width, `file.py:123` right-aligned, repeated
timestamps blanked), the `--console_log_simple` alternative (plain messages on
stdout), logging records in accelerate's name, and the training progress bar
written to stderr in tqdm's exact format with `\\r` and no newline until close.
Neither rich nor tqdm is a dependency, so both formats are reproduced here.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import sys
import time
import unicodedata
from datetime import datetime
from pathlib import Path
from typing import TextIO

DATEFMT = "%Y-%m-%d %H:%M:%S"
LEVEL_WIDTH = 8
_WORD = re.compile(r"\s*\S+\s*")
_BAR_CHARS = " ▏▎▍▌▋▊▉█"


def cell_len(text: str) -> int:
    """Terminal cells a string takes: wide CJK characters count double, like rich."""
    return sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def console_width(stream: TextIO) -> int:
    """rich's rule: COLUMNS wins; else the terminal size; else 80 when not a terminal."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        pass
    return 80


def _chop_cells(word: str, width: int) -> list[str]:
    chunks: list[str] = []
    current, used = "", 0
    for ch in word:
        size = cell_len(ch)
        if used + size > width and current:
            chunks.append(current)
            current, used = "", 0
        current += ch
        used += size
    if current:
        chunks.append(current)
    return chunks


def wrap_like_rich(text: str, width: int) -> list[str]:
    """Break at spaces; a word longer than the line is folded mid-word (rich's divide_line)."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(text):
        start, word = match.start(), match.group(0)
        word_len = cell_len(word.rstrip())
        if width - offset >= word_len:
            offset += cell_len(word)
        elif word_len > width:
            chunks = _chop_cells(word, width)
            for i, chunk in enumerate(chunks):
                if start:
                    breaks.append(start)
                if i == len(chunks) - 1:
                    offset = cell_len(chunk)
                else:
                    start += len(chunk)
        elif offset and start:
            breaks.append(start)
            offset = cell_len(word)
    bounds = [0, *breaks, len(text)]
    return [text[a:b].rstrip() for a, b in itertools.pairwise(bounds)]


class RichLikeHandler(logging.Handler):
    """Formats records the way kohya's RichHandler(console=Console(stderr=True)) prints them."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self.stream = stream if stream is not None else sys.stderr
        self._last_time = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.render(record))
            self.flush()
        except Exception:  # noqa: BLE001 - like logging.StreamHandler: a log line must never kill training
            self.handleError(record)

    def flush(self) -> None:
        self.stream.flush()

    def render(self, record: logging.LogRecord) -> str:
        width = console_width(self.stream)
        stamp = datetime.fromtimestamp(record.created).strftime(DATEFMT)
        # rich leaves the time column blank when it repeats the previous record's time
        shown = " " * len(stamp) if stamp == self._last_time else stamp
        self._last_time = stamp
        path = f"{Path(record.pathname).name}:{record.lineno}"
        msg_width = max(width - len(stamp) - LEVEL_WIDTH - 3 - cell_len(path), 10)
        lines: list[str] = []
        for paragraph in self.format(record).split("\n"):
            lines.extend(wrap_like_rich(paragraph, msg_width) or [""])
        out = []
        for i, line in enumerate(lines):
            pad = " " * max(msg_width - cell_len(line), 0)
            if i == 0:
                out.append(f"{shown} {record.levelname.ljust(LEVEL_WIDTH)} {line}{pad} {path}")
            else:
                # continuation lines keep the columns, padded to the full width as rich does
                blank = " " * (len(stamp) + LEVEL_WIDTH + 2)
                out.append(f"{blank}{line}{pad} {' ' * cell_len(path)}")
        return "\n".join(out) + "\n"


def setup_logging(simple: bool = False, level: str | None = None) -> None:
    """Install the one root handler, replacing any earlier one (kohya's setup_logging(reset=True))."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    handler: logging.Handler
    if simple:
        handler = logging.StreamHandler(sys.stdout)
    else:
        handler = RichLikeHandler()
    handler.setFormatter(logging.Formatter(fmt="%(message)s", datefmt=DATEFMT))
    root.addHandler(handler)
    root.setLevel(getattr(logging, (level or "INFO").upper()))


def log_as(source_file: str, lineno: int, message: str, level: int = logging.INFO) -> None:
    """Log a line the way another library would, e.g. accelerate's `checkpointing.py:123`.

    The demo reproduces accelerate's save/load messages; giving them accelerate's source
    file keeps the right-hand column of the console the same as in real runs.
    """
    logger = logging.getLogger("accelerate")
    if logger.isEnabledFor(level):
        record = logger.makeRecord(logger.name, level, source_file, lineno, message, (), None)
        logger.handle(record)


def format_interval(seconds: float) -> str:
    mins, secs = divmod(int(seconds), 60)
    hours, mins = divmod(mins, 60)
    return f"{hours:d}:{mins:02d}:{secs:02d}" if hours else f"{mins:02d}:{secs:02d}"


def format_num(value: object) -> str:
    """tqdm's postfix number format: `{:.3g}` unless plain str() is shorter."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        short = f"{value:.3g}".replace("+0", "+").replace("-0", "-")
        plain = str(value)
        return short if len(short) < len(plain) else plain
    return str(value)


def format_meter(n: int, total: int | None, elapsed: float, desc: str | None, postfix: str) -> str:
    """tqdm.format_meter with ncols unknown (a 10-cell bar) and smoothing=0."""
    prefix = f"{desc}: " if desc else ""
    rate = n / elapsed if elapsed and n else None
    inv_rate = 1 / rate if rate else None
    if inv_rate and inv_rate > 1:
        rate_fmt = f"{inv_rate:5.2f}s/it"
    else:
        rate_fmt = (f"{rate:5.2f}" if rate else "?") + "it/s"
    tail = f", {postfix}" if postfix else ""
    elapsed_str = format_interval(elapsed)
    # tqdm drops the bar once n passes total (a resumed kohya run can do that)
    if total and n >= total + 0.5:
        total = None
    if not total:
        return f"{prefix}{n}it [{elapsed_str}, {rate_fmt}{tail}]"
    remaining = format_interval((total - n) / rate) if rate else "?"
    frac = n / total
    full, part = divmod(int(frac * 10 * 8), 8)
    bar = _BAR_CHARS[-1] * full
    if full < 10:
        bar += _BAR_CHARS[part] + _BAR_CHARS[0] * (10 - full - 1)
    return f"{prefix}{frac * 100:3.0f}%|{bar}| {n}/{total} [{elapsed_str}<{remaining}, {rate_fmt}{tail}]"


class ProgressBar:
    """A tqdm look-alike on stderr: `\\r` before every refresh, a newline only on close()."""

    MININTERVAL = 0.1

    def __init__(self, total: int | None, desc: str | None = None, stream: TextIO | None = None) -> None:
        self.total = total
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.n = 0
        self.postfix = ""
        self.start = time.time()
        self._last_len = 0
        self._last_print = 0.0
        self.closed = False
        self.refresh()

    def refresh(self) -> None:
        text = format_meter(self.n, self.total, time.time() - self.start, self.desc, self.postfix)
        pad = " " * max(self._last_len - len(text), 0)
        self.stream.write("\r" + text + pad)
        # stderr is line-buffered and this line has no newline: flush or nobody sees progress
        self.stream.flush()
        self._last_len = len(text)
        self._last_print = time.time()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.time() - self._last_print >= self.MININTERVAL:
            self.refresh()

    def set_postfix(self, **values: object) -> None:
        self.postfix = ", ".join(f"{k}={format_num(values[k]).strip()}" for k in sorted(values))
        self.refresh()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.refresh()
            self.stream.write("\n")
            self.stream.flush()
