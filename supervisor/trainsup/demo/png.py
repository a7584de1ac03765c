"""A minimal PNG codec (zlib + struct) for the demo trainer's images and samples.

PIL is not available in the demo environment, so this module owns writing and
reading the small 8-bit PNG files the demo uses: the dataset images written by
`make_assets`, the images read by the dataset, and the sample images written
during training. It also owns the nearest-neighbour resize the demo uses to
bring any image to the model's fixed resolution.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# channels per PNG colour type (8-bit only); palette images (type 3) are not supported
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def encode_png(rgb: np.ndarray) -> bytes:
    """Encode an HxWx3 uint8 array as an 8-bit RGB PNG (filter type 0 on every row)."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an HxWx3 uint8 array, got {rgb.dtype} {rgb.shape}")
    height, width = rgb.shape[:2]
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(height))
    return _SIGNATURE + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


def write_png(path: Path, rgb: np.ndarray) -> None:
    path.write_bytes(encode_png(rgb))


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(data: bytes, width: int, height: int, bpp: int) -> np.ndarray:
    stride = width * bpp
    out = bytearray(stride * height)
    prev = bytearray(stride)
    pos = 0
    for y in range(height):
        ftype = data[pos]
        line = bytearray(data[pos + 1 : pos + 1 + stride])
        pos += 1 + stride
        # filters reference the byte bpp to the left (a), above (b) and above-left (c)
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 0xFF
            elif ftype == 4:
                line[i] = (line[i] + _paeth(a, b, c)) & 0xFF
            elif ftype != 0:
                raise ValueError(f"bad PNG filter type {ftype}")
        out[y * stride : (y + 1) * stride] = line
        prev = line
    return np.frombuffer(bytes(out), dtype=np.uint8).reshape(height, width, bpp)


def decode_png(blob: bytes) -> np.ndarray:
    """Decode an 8-bit, non-interlaced PNG to an HxWx3 uint8 RGB array (alpha is dropped)."""
    if not blob.startswith(_SIGNATURE):
        raise ValueError("not a PNG file")
    pos = len(_SIGNATURE)
    header: tuple[int, ...] | None = None
    idat = bytearray()
    while pos + 8 <= len(blob):
        (length,) = struct.unpack(">I", blob[pos : pos + 4])
        kind = blob[pos + 4 : pos + 8]
        data = blob[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError("PNG without IHDR")
    width, height, depth, ctype, _, _, interlace = header
    if depth != 8 or ctype not in _CHANNELS or interlace:
        raise ValueError(f"unsupported PNG (bit depth {depth}, colour type {ctype}, interlace {interlace})")
    pixels = _unfilter(zlib.decompress(bytes(idat)), width, height, _CHANNELS[ctype])
    if ctype in (0, 4):
        return np.repeat(pixels[:, :, :1], 3, axis=2)
    return np.ascontiguousarray(pixels[:, :, :3])


def read_png(path: Path) -> np.ndarray:
    return decode_png(path.read_bytes())


def resize_nearest(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """Nearest-neighbour resize; the demo model has one fixed input size."""
    src_h, src_w = rgb.shape[:2]
    if (src_w, src_h) == (width, height):
        return rgb
    ys = (np.arange(height) * src_h // height).clip(0, src_h - 1)
    xs = (np.arange(width) * src_w // width).clip(0, src_w - 1)
    return np.ascontiguousarray(rgb[ys][:, xs])
