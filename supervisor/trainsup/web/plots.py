"""Owns the page's plots: server-side downsampling and the SVG of the loss and GPU memory curves.

A run of hundreds of thousands of steps becomes at most ``BINS`` points a series: the x range is cut
into equal bins and each bin drawn as its mean, with a light band from its smallest to its largest
value, so a spike survives the downsampling as band rather than vanishing. Each attempt is its own
series (a resumed attempt goes back to its resume step and overlaps the steps its predecessor lost);
a resumed attempt starts with a dashed boundary line, and a fault is a red mark where its attempt
ended. The SVG is plain markup (no script): every number and name in it is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from markupsafe import Markup, escape
from numpy.typing import ArrayLike

BINS = 600
WIDTH, HEIGHT = 900, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 34
PALETTE = ("#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f", "#7c2d12")


@dataclass(frozen=True)
class Bin:
    x: float
    mean: float
    low: float
    high: float


@dataclass(frozen=True)
class Mark:
    x: float
    label: str
    kind: str  # "boundary" or "fault"
    title: str = ""  # the hover text (the label when empty)


def downsample(xs: ArrayLike, ys: ArrayLike, lo: float, hi: float, bins: int = BINS) -> list[Bin]:
    """``(x, y)`` pairs (a NaN or infinite y skipped) as at most ``bins`` bins over ``[lo, hi]``.

    numpy does the binning: a refresh of a 300,000-step curve costs milliseconds, not a second."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    keep = np.isfinite(y) & np.isfinite(x)
    x, y = x[keep], y[keep]
    if not len(x):
        return []
    width = (hi - lo) / bins if hi > lo else 1.0
    key = np.clip(((x - lo) / width).astype(np.int64), 0, bins - 1) if hi > lo else np.zeros(len(x), np.int64)
    order = np.argsort(key, kind="stable")
    key, x, y = key[order], x[order], y[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    counts = np.diff(np.r_[starts, len(key)])
    mean_x = np.add.reduceat(x, starts) / counts
    mean_y = np.add.reduceat(y, starts) / counts
    low, high = np.minimum.reduceat(y, starts), np.maximum.reduceat(y, starts)
    return [Bin(float(a), float(b), float(c), float(d)) for a, b, c, d in zip(mean_x, mean_y, low, high, strict=True)]


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = min((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw), default=raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10000 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.4g}"


class Frame:
    """Data coordinates to SVG pixels."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float) -> None:
        if x1 <= x0:
            x1 = x0 + 1
        if y1 <= y0:
            pad = abs(y0) * 0.05 or 1.0
            y0, y1 = y0 - pad, y1 + pad
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1

    def px(self, x: float) -> float:
        return LEFT + (x - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def py(self, y: float) -> float:
        y = min(max(y, self.y0), self.y1)
        return TOP + (1 - (y - self.y0) / (self.y1 - self.y0)) * (HEIGHT - TOP - BOTTOM)


def line_chart(series: Sequence[tuple[str, list[Bin]]], marks: Sequence[Mark], x_label: str, y_label: str,
               x_range: tuple[float, float] | None = None, x_format: str = "number") -> Markup:
    """An SVG with one polyline (and band) per named series; ``data-points`` counts the points drawn."""
    values = [v for _, bins in series for b in bins for v in (b.low, b.high)]
    xs = [b.x for _, bins in series for b in bins] + [m.x for m in marks]
    if x_range is None:
        x_range = (min(xs, default=0.0), max(xs, default=1.0))
    y_lo, y_hi = _robust_range(values)
    frame = Frame(x_range[0], x_range[1], y_lo, y_hi)
    points = sum(len(bins) for _, bins in series)
    out = [(f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" data-points="{points}" '
            f'preserveAspectRatio="none" class="chart"><title>{escape(y_label)} over {escape(x_label)}</title>')]
    for y in _ticks(frame.y0, frame.y1, 4):
        py = frame.py(y)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py:.1f}" y2="{py:.1f}"/>'
                   f'<text class="tick" x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{_fmt(y)}</text>')
    for x in _ticks(frame.x0, frame.x1, 6):
        px = frame.px(x)
        label = _clock(x) if x_format == "time" else _fmt(x)
        out.append(f'<text class="tick" x="{px:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{label}</text>')
    out.append(f'<text class="axis" x="{WIDTH - RIGHT}" y="{HEIGHT - 4}" text-anchor="end">{escape(x_label)}</text>')
    for index, (name, bins) in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        if not bins:
            continue
        band = " ".join(f"{frame.px(b.x):.1f},{frame.py(b.high):.1f}" for b in bins)
        band += " " + " ".join(f"{frame.px(b.x):.1f},{frame.py(b.low):.1f}" for b in reversed(bins))
        line = " ".join(f"{frame.px(b.x):.1f},{frame.py(b.mean):.1f}" for b in bins)
        out.append(f'<polygon class="band" points="{band}" fill="{color}"/>'
                   f'<polyline class="series" data-name="{escape(name)}" points="{line}" stroke="{color}">'
                   f'<title>{escape(name)}</title></polyline>')
        if len(bins) == 1:
            out.append(f'<circle class="dot" cx="{frame.px(bins[0].x):.1f}" cy="{frame.py(bins[0].mean):.1f}" '
                       f'r="3" fill="{color}"/>')
    for mark in marks:
        px = frame.px(min(max(mark.x, frame.x0), frame.x1))
        if mark.kind == "boundary":
            out.append(f'<line class="boundary" x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}">'
                       f'<title>{escape(mark.title or mark.label)}</title></line>'
                       f'<text class="mark" x="{px + 3:.1f}" y="{TOP + 10}">{escape(mark.label)}</text>')
        else:
            out.append(f'<g class="fault"><title>{escape(mark.title or mark.label)}</title>'
                       f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}"/>'
                       f'<circle cx="{px:.1f}" cy="{TOP + 4}" r="5"/></g>')
    out.append("</svg>")
    return Markup("".join(out))


def _robust_range(values: list[float]) -> tuple[float, float]:
    """The y range: all values, unless a few spikes would flatten the rest (then the 1st..99th
    percentile, the spikes drawn clipped at the edge)."""
    if not values:
        return 0.0, 1.0
    ordered = sorted(values)
    lo, hi = ordered[0], ordered[-1]
    if len(ordered) >= 50:
        p_lo, p_hi = ordered[len(ordered) // 100], ordered[-1 - len(ordered) // 100]
        if p_hi > p_lo and (hi - lo) > 4 * (p_hi - p_lo):
            lo, hi = p_lo, p_hi
    return lo, hi


def _clock(ts: float) -> str:
    import time

    return time.strftime("%H:%M", time.localtime(ts))
