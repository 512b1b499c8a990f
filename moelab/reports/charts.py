"""Charts as inline SVG strings (matplotlib, Agg): the report needs no network and no JavaScript."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams["svg.hashsalt"] = "moelab"  # stable ids: golden files do not churn


def _to_svg(fig: plt.Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def line_chart(
    series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float] | None, Sequence[float] | None]],
    title: str,
    xlabel: str,
    ylabel: str,
) -> str:
    """One line per series: (x, y, y_low, y_high); the low/high band shows the spread."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, (xs, ys, lo, hi) in series.items():
        (line,) = ax.plot(xs, ys, marker="o", label=name)
        if lo is not None and hi is not None:
            ax.fill_between(xs, lo, hi, alpha=0.2, color=line.get_color())
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return _to_svg(fig)


def bar_chart(labels: Sequence[str], values: Sequence[float], title: str, ylabel: str) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 0.4 * max(len(labels), 3) + 1))
    ax.barh(range(len(labels)), values, color="#4477aa")
    ax.set_yticks(range(len(labels)), labels, fontsize="x-small")
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel(ylabel)
    ax.grid(True, axis="x", alpha=0.3)
    return _to_svg(fig)
