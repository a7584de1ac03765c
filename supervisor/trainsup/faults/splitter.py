"""Owns turning a byte stream into lines: split on ``\\n`` and ``\\r``, keep the partial tail, cap length.

Pure and allocation-light: the pump calls it for every chunk a child writes. tqdm redraws its bar with
``\\r`` and no newline for hours, so ``\\r`` ends a line too. A line longer than ``max_line`` is cut at
the cap and the rest of it is dropped until the next line break, so an endless line cannot grow memory.
"""

from __future__ import annotations

DEFAULT_MAX_LINE = 64 * 1024


class LineSplitter:
    """Incremental splitter over one stream. ``feed`` returns the complete lines, decoded."""

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        if max_line < 1:
            raise ValueError(f"max_line: expected an integer >= 1, got {max_line}")
        self.max_line = max_line
        self._tail = b""
        self._overlong = False  # inside a line that already hit the cap: drop until a break
        self.truncated_lines = 0

    def feed(self, chunk: bytes) -> list[str]:
        data = self._tail + chunk if self._tail else chunk
        self._tail = b""
        last = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if last < 0:
            return self._keep_tail(data, [])
        head, rest = data[:last], data[last + 1 :]
        if self._overlong:
            # The first piece finishes a line already emitted at the cap: drop it.
            breaks = [i for i in (head.find(b"\n"), head.find(b"\r")) if i >= 0]
            head = head[min(breaks) + 1 :] if breaks else b""
            self._overlong = False
        # Breaks are ASCII, so the complete part decodes whole, in one C call; the tail stays bytes
        # because a multi-byte character may continue in the next chunk.
        text = head.decode("utf-8", errors="replace").replace("\r", "\n")
        lines = [line for line in text.split("\n") if line]  # "\r\n" and blank redraws carry nothing
        for i, line in enumerate(lines):
            if len(line) > self.max_line:
                lines[i] = line[: self.max_line]
                self.truncated_lines += 1
        return self._keep_tail(rest, lines)

    def _keep_tail(self, rest: bytes, lines: list[str]) -> list[str]:
        if self._overlong:
            return lines
        if len(rest) > self.max_line:
            lines.append(self._decode(rest[: self.max_line]))
            self.truncated_lines += 1
            self._overlong = True
        else:
            self._tail = rest
        return lines

    def flush(self) -> list[str]:
        """The unterminated last line, at end of stream."""
        rest, self._tail = self._tail, b""
        self._overlong = False
        return [self._decode(rest)] if rest else []

    @property
    def pending_bytes(self) -> int:
        return len(self._tail)

    @staticmethod
    def _decode(raw: bytes) -> str:
        # Children print binary garbage now and then; never let a decode error reach the loop.
        return raw.decode("utf-8", errors="replace")
