"""Small hand-built SVG charts for the history view: stacked panels over one x axis, a line and a band per
panel, and vertical markers (steps, labels, environment changes).

Why not matplotlib: a history report draws one chart per series, each over up to thousands of runs;
a matplotlib figure costs ~0.5 s to save, a string of SVG a millisecond. Every point list is thinned
to at most MAX_POINTS buckets (mean line, widest band) before drawing, so a chart's size follows the
width in pixels, not the number of runs. Text is XML-escaped here; nothing else reaches the SVG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape

import numpy as np

WIDTH = 820
PANEL_HEIGHT = 150
LEFT, RIGHT, TOP, GAP, BOTTOM = 64, 16, 26, 18, 34
MAX_POINTS = 400  # buckets per line: about two pixels each
MARKER_COLOURS = {"slower": "#c0392b", "faster": "#1e8449", "label": "#6c3483", "env": "#7f8c8d"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Panel:
    ylabel: str
    y: np.ndarray  # the line (NaN: no point)
    lo: np.ndarray | None = None  # band, e.g. p10..p90
    hi: np.ndarray | None = None
    colour: str = "#2e6da4"


@dataclass(frozen=True, kw_only=True, slots=True)
class Marker:
    x: float
    kind: str  # a key of MARKER_COLOURS
    text: str  # shown next to the line (may be "")
    title: str = ""  # tooltip


@dataclass(frozen=True, kw_only=True, slots=True)
class Chart:
    x: np.ndarray  # ascending: epoch seconds (time axis) or run ordinals
    panels: Sequence[Panel]
    markers: Sequence[Marker] = field(default_factory=tuple)
    time_axis: bool = True


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def thin(
    x: np.ndarray, cols: Sequence[np.ndarray], max_points: int = MAX_POINTS
) -> tuple[np.ndarray, list[np.ndarray]]:
    """At most `max_points` buckets of equal x width: the mean x and the mean of each column (NaN
    ignored) per bucket. Bands go through `thin_band` over the same buckets."""
    if x.size <= max_points:
        return x, list(cols)
    edges = np.linspace(x[0], x[-1], max_points + 1)
    bucket = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, max_points - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    counts = np.diff(np.r_[starts, x.size])
    out_x = np.add.reduceat(x, starts) / counts
    out = []
    for c in cols:
        finite = np.isfinite(c)
        sums = np.add.reduceat(np.where(finite, c, 0.0), starts)
        n = np.add.reduceat(finite.astype(np.float64), starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append(np.where(n > 0, sums / np.maximum(n, 1), np.nan))
    return out_x, out


def thin_band(
    x: np.ndarray, lo: np.ndarray, hi: np.ndarray, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """The band over the same buckets as `thin`: the lowest low and the highest high of each bucket."""
    if x.size <= max_points:
        return lo, hi
    edges = np.linspace(x[0], x[-1], max_points + 1)
    bucket = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, max_points - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    return (
        np.fmin.reduceat(np.where(np.isfinite(lo), lo, np.inf), starts),
        np.fmax.reduceat(np.where(np.isfinite(hi), hi, -np.inf), starts),
    )


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e4 or a < 1e-2:
        return f"{v:.2g}"
    return f"{v:.4g}"


def _x_label(v: float, time_axis: bool, span: float) -> str:
    if not time_axis:
        return f"{v:.0f}"
    t = datetime.fromtimestamp(v, tz=timezone.utc)
    return t.strftime("%m-%d %H:%M") if span < 3 * 86400 else t.strftime("%Y-%m-%d")


XScale = Callable[[np.ndarray | float], np.ndarray | float]


def render(chart: Chart, title: str) -> str:
    """The chart as one <svg> element (width WIDTH, panels stacked), XML-escaped text."""
    x = chart.x
    n_panels = len(chart.panels)
    height = TOP + n_panels * PANEL_HEIGHT + (n_panels - 1) * GAP + BOTTOM
    plot_w = WIDTH - LEFT - RIGHT
    x0, x1 = (float(x[0]), float(x[-1])) if x.size else (0.0, 1.0)
    if x1 <= x0:
        x0, x1 = x0 - 1, x1 + 1

    def sx(v: np.ndarray | float) -> np.ndarray | float:
        return LEFT + (np.asarray(v) - x0) / (x1 - x0) * plot_w

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" font-family="sans-serif" font-size="11" role="img">',
        f"<title>{escape(title)}</title>",
    ]
    for i, panel in enumerate(chart.panels):
        parts += _panel(panel, x, sx, TOP + i * (PANEL_HEIGHT + GAP), plot_w)
    plot_top, plot_bottom = TOP, TOP + n_panels * PANEL_HEIGHT + (n_panels - 1) * GAP
    parts += _markers(chart.markers, sx, plot_top, plot_bottom)
    span = x1 - x0
    for t in np.linspace(x0, x1, 6) if x.size else []:
        xx = float(sx(t))
        parts.append(
            f'<text x="{xx:.1f}" y="{plot_bottom + 16}" text-anchor="middle">{escape(_x_label(float(t), chart.time_axis, span))}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2:.1f}" y="{plot_bottom + 30}" text-anchor="middle" fill="#555">'
        f"{'run time (UTC)' if chart.time_axis else 'run (in order)'}</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)


def _panel(panel: Panel, x: np.ndarray, sx: XScale, top: float, plot_w: float) -> list[str]:
    """One panel: its frame and label, y grid, the band (when the panel has one), the line and, for few
    points, each point."""
    bottom = top + PANEL_HEIGHT
    px, (py,) = thin(x, [panel.y])
    band = None
    if panel.lo is not None and panel.hi is not None:
        band = thin_band(x, panel.lo, panel.hi)
    finite = [a[np.isfinite(a)] for a in (py, *(band or ()))]
    values = np.concatenate(finite) if finite else np.zeros(0)
    parts = [
        f'<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{PANEL_HEIGHT}" fill="#fbfbfb" stroke="#ccc"/>',
        f'<text x="{LEFT - 52}" y="{(top + bottom) / 2:.1f}" transform="rotate(-90 {LEFT - 52} {(top + bottom) / 2:.1f})" '
        f'text-anchor="middle">{escape(panel.ylabel)}</text>',
    ]
    if values.size == 0:
        parts.append(f'<text x="{LEFT + 8}" y="{top + 16}" fill="#888">no data</text>')
        return parts
    lo, hi = float(values.min()), float(values.max())
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    lo, hi = max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad

    def sy(v: np.ndarray | float) -> np.ndarray | float:
        return top + PANEL_HEIGHT - (np.asarray(v) - lo) / (hi - lo) * PANEL_HEIGHT

    for t in nice_ticks(lo, hi):
        yy = float(sy(t))
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e3e3e3"/>')
        parts.append(f'<text x="{LEFT - 4}" y="{yy + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    if band is not None:
        parts += _band(band, px, sx, sy, panel.colour)
    ok = np.isfinite(py)
    pts = " ".join(
        f"{a:.1f},{b:.1f}" for a, b in zip(np.asarray(sx(px[ok])), np.asarray(sy(py[ok])), strict=True)
    )
    parts.append(f'<polyline points="{pts}" fill="none" stroke="{panel.colour}" stroke-width="1.4"/>')
    if ok.sum() <= 60:  # few points: show each one
        for a, b in zip(np.asarray(sx(px[ok])), np.asarray(sy(py[ok])), strict=True):
            parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.2" fill="{panel.colour}"/>')
    return parts


def _band(
    band: tuple[np.ndarray, np.ndarray], px: np.ndarray, sx: XScale, sy: XScale, colour: str
) -> list[str]:
    blo, bhi = band
    ok = np.isfinite(blo) & np.isfinite(bhi)
    if not ok.any():
        return []
    bx = np.asarray(sx(px[ok]))
    upper = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(bx, np.asarray(sy(bhi[ok])), strict=True))
    lower = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(bx[::-1], np.asarray(sy(blo[ok]))[::-1], strict=True))
    return [f'<polygon points="{upper} {lower}" fill="{colour}" fill-opacity="0.18" stroke="none"/>']


def _markers(markers: Sequence[Marker], sx: XScale, plot_top: float, plot_bottom: float) -> list[str]:
    """A vertical line per marker through every panel, its text above the plot in two staggered rows."""
    parts = []
    labelled = 0
    for m in sorted(markers, key=lambda m: m.x):
        mx = float(sx(m.x))
        colour = MARKER_COLOURS.get(m.kind, "#555")
        dash = "" if m.kind in ("slower", "faster") else ' stroke-dasharray="3,3"'
        parts.append(
            f'<line x1="{mx:.1f}" x2="{mx:.1f}" y1="{plot_top}" y2="{plot_bottom}" stroke="{colour}"{dash}>'
            f"<title>{escape(m.title or m.text)}</title></line>"
        )
        if m.text:
            labelled += 1
            y = plot_top - 4 - (labelled % 2) * 11
            parts.append(f'<text x="{mx + 2:.1f}" y="{y}" fill="{colour}">{escape(m.text)}</text>')
    return parts
