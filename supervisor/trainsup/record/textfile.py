"""Owns reading a person's text file (a project, a policy, an inbox drop, a trainer's prompts or
config): bytes to ``str``, or one ``NotTextError`` that names the file and what to do.

UTF-8 is the rule. A byte-order mark is honoured where the reader allows it (``boms=True``, the
default): UTF-8 with a BOM, UTF-16 and UTF-32 (LE or BE; Windows Notepad's "Unicode" is UTF-16 LE
with a BOM) are decoded as they say. A trainer reads its own files as plain UTF-8, so its readers
pass ``boms=False``: a UTF-16/32 file is then refused (a UTF-8 BOM is left in the text, as the
trainer would see it), never accepted for a trainer that would crash on it. Anything else that is not
UTF-8 is refused with the byte, line and column at fault; NUL bytes without a BOM mean a binary file
(or UTF-16 without a BOM, said so when the NULs fall every other byte).

``NotTextError`` is a ``ValueError``, so callers that already turn a ``ValueError`` into their own
error (a usage error, a rejected edit) keep doing so.
"""

from __future__ import annotations

import codecs
from pathlib import Path

# Longest first: UTF-32 LE's mark begins with UTF-16 LE's.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
_NAMES = {"utf-32": "UTF-32", "utf-16": "UTF-16", "utf-8-sig": "UTF-8", "utf-8": "UTF-8"}
SAVE_AS = "save it as UTF-8"


class NotTextError(ValueError):
    """A file that is not text trainsup can read; ``str()`` is ``FILE: why; what to do``."""

    def __init__(self, path: str | Path, reason: str, line: int | None = None) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.line = str(path), reason, line


def read_text(path: Path, what: str = "text file", *, boms: bool = True) -> str:
    """``path``'s text; raises ``OSError`` (unreadable) or ``NotTextError`` (not text)."""
    return decode_text(path.read_bytes(), path, what, boms=boms)


def decode_text(raw: bytes, path: str | Path, what: str = "text file", *, boms: bool = True) -> str:
    """``raw`` (the content of ``path``, read once) as text; ``what`` names the kind of file in the
    binary message (``a binary file, not a text project file``)."""
    encoding = next((enc for mark, enc in _BOMS if raw.startswith(mark)), None)
    if encoding is not None and encoding != "utf-8-sig":
        if not boms:
            raise NotTextError(path, f"{_NAMES[encoding]} text (it starts with a byte-order mark), which the "
                               f"trainer reads as UTF-8; {SAVE_AS}")
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise NotTextError(path, f"not {_NAMES[encoding]} text though it starts with its byte-order mark "
                               f"(byte {exc.start}); {SAVE_AS}") from None
    if encoding in (None, "utf-8-sig") and b"\0" in raw:
        if _utf16_without_bom(raw):
            raise NotTextError(path, f"UTF-16 text without a byte-order mark; {SAVE_AS}")
        raise NotTextError(path, f"a binary file, not a text {what}")
    try:
        return raw.decode("utf-8-sig" if encoding is not None and boms else "utf-8")
    except UnicodeDecodeError as exc:
        line, column = _place(raw, exc.start)
        raise NotTextError(path, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}, column {column}); "
                           f"{SAVE_AS}", line) from None


def _place(raw: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of the byte at ``offset``; what precedes it is UTF-8."""
    start = raw.rfind(b"\n", 0, offset) + 1
    return raw.count(b"\n", 0, offset) + 1, len(raw[start:offset].decode("utf-8", "replace")) + 1


def _utf16_without_bom(raw: bytes) -> bool:
    """Mostly-ASCII UTF-16: NULs in (nearly) every odd byte and no even one, or the other way round."""
    head = raw[:4096]
    pairs = len(head) // 2
    if pairs < 2:
        return False
    even, odd = head[0::2].count(0), head[1::2].count(0)
    return (odd >= pairs * 0.6 and even == 0) or (even >= pairs * 0.6 and odd == 0)
