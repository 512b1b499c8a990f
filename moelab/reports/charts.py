"""Charts as inline SVG strings (matplotlib, Agg): the report needs no network and no JavaScript.

Text from the database (backend names, knobs) reaches the SVG only through matplotlib, which escapes it
as XML; mathtext is off so a `$` in a name is drawn, not parsed.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import matplotlib.pyplot as plt


@functools.cache
def _pyplot() -> Any:
    """matplotlib, imported on the first chart: commands that draw nothing do not pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "moelab"  # stable ids: golden files do not churn
    plt.rcParams["text.parse_math"] = False
    return plt


@dataclass(frozen=True, kw_only=True, slots=True)
class Series:
    xs: Sequence[float]
    ys: Sequence[float]
    lo: Sequence[float] | None = None  # band: the spread (e.g. bandwidth at p90 and p10 time)
    hi: Sequence[float] | None = None
    fit_ys: Sequence[float] | None = None  # a model drawn dashed over the points
    marks: Sequence[tuple[float, float, str]] = field(default_factory=tuple)  # annotated points (the knee)


def _to_svg(fig: plt.Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    _pyplot().close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def _draw(ax: plt.Axes, series: Mapping[str, Series], hline: tuple[float, str] | None, logx: bool) -> None:
    for name, s in series.items():
        (line,) = ax.plot(s.xs, s.ys, marker="o", label=name)
        color = line.get_color()
        if s.lo is not None and s.hi is not None:
            ax.fill_between(s.xs, s.lo, s.hi, alpha=0.2, color=color)
        if s.fit_ys is not None:
            ax.plot(s.xs, s.fit_ys, linestyle="--", color=color, alpha=0.7)
        for x, y, text in s.marks:
            ax.plot([x], [y], marker="*", markersize=14, color=color, markeredgecolor="black")
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, -12), fontsize="x-small")
    if hline is not None:
        ax.axhline(hline[0], color="#b00", linestyle=":", linewidth=1.2, label=hline[1])
    if logx:
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

        # plain tick labels at the measured points: mathtext is off, so the default 2^n labels would show raw
        ax.set_xscale("log", base=2)
        ticks = sorted({float(x) for s in series.values() for x in s.xs})
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")


def line_chart(
    series: Mapping[str, Series],
    title: str,
    xlabel: str,
    ylabel: str,
    hline: tuple[float, str] | None = None,
    logx: bool = False,
) -> str:
    """One line per series, a band for its spread, optional fit and marks, and an optional reference line."""
    fig, ax = _pyplot().subplots(figsize=(6.4, 3.6))
    _draw(ax, series, hline, logx)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return _to_svg(fig)


def pair_chart(
    left: Mapping[str, Series],
    right: Mapping[str, Series],
    title: str,
    xlabel: str,
    ylabels: tuple[str, str],
    hline: tuple[float, str] | None = None,
    logx: bool = False,
) -> str:
    """Two panels over the same x (bandwidth and latency against tokens); the reference line goes left."""
    fig, (ax_l, ax_r) = _pyplot().subplots(1, 2, figsize=(11, 3.8))
    _draw(ax_l, left, hline, logx)
    _draw(ax_r, right, None, logx)
    for ax, ylabel in ((ax_l, ylabels[0]), (ax_r, ylabels[1])):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
    fig.suptitle(title)
    return _to_svg(fig)


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    title: str,
    xlabel: str,
    vline: tuple[float, str] | None = None,
) -> str:
    fig, ax = _pyplot().subplots(figsize=(6.4, 0.4 * max(len(labels), 3) + 1))
    ax.barh(range(len(labels)), values, color="#4477aa")
    ax.set_yticks(range(len(labels)), labels, fontsize="x-small")
    ax.invert_yaxis()
    if vline is not None:
        ax.axvline(vline[0], color="#b00", linestyle=":", linewidth=1.2, label=vline[1])
        ax.legend(fontsize="x-small")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.grid(True, axis="x", alpha=0.3)
    return _to_svg(fig)
