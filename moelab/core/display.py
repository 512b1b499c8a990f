"""Strings and numbers as a terminal or a report shows them.

`safe_text`: stored strings (labels, reasons, log tails, exception messages) may hold control bytes, from
old databases or from a crashing library; printed raw, an ESC sequence clears or retitles the terminal.
Jinja's autoescape covers HTML markup, not control bytes.

Units: the console, the HTML report and the Markdown report print every figure through the formatters
here, so a time reads the same everywhere (`format_time_us`: `279.6 ms`, never `2.796e+05 µs`), a plain
figure never in scientific notation (`format_number`: `478.1`, `412,300`) and a fraction as a percentage
(`format_pct`: `84%`, `0.43%`).
"""

from __future__ import annotations

import math

_KEEP = {"\n", "\t"}


def safe_text(s: object, keep_newlines: bool = False) -> str:
    """`s` as text with every control character (C0, DEL, C1, line/paragraph separators) written as a
    visible escape (`\\x1b`, `\\u2028`); newlines and tabs stay when `keep_newlines` (log tails)."""
    text = "" if s is None else str(s)
    if not any(_is_control(c) for c in text):
        return text
    out = []
    for c in text:
        if keep_newlines and c in _KEEP:
            out.append(c)
        elif _is_control(c):
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}")
        else:
            out.append(c)
    return "".join(out)


def _is_control(c: str) -> bool:
    o = ord(c)
    return o < 32 or 0x7F <= o < 0xA0 or c in "\u2028\u2029"


# a figure this large keeps its exponent: `--nvlink-gbps 1e-300` printed a bound of 295 digits
PLAIN_BELOW = 1e12


def format_time_us(us: float | None, digits: int = 4) -> str:
    """A time given in microseconds, in ns, µs, ms or s, whichever keeps the figure between 1 and 1000
    (`2.796e+05 µs` → `279.6 ms`); `—` for a missing figure."""
    if us is None:
        return "—"
    if math.isnan(us):
        return "nan"
    if math.isinf(us):
        return "inf µs" if us > 0 else "-inf µs"
    a = float(f"{abs(us):.{digits}g}")  # choose the unit after rounding: 999.99 µs is 1 ms
    if a == 0:
        return "0 µs"
    for scale, unit in ((1e6, "s"), (1e3, "ms"), (1.0, "µs"), (1e-3, "ns")):
        if a >= scale or unit == "ns":
            v = us / scale
            text = f"{v:.{digits}g}"
            if "e" in text and abs(v) < PLAIN_BELOW:  # below 1 ns, or 1e4 s up to PLAIN_BELOW: plain
                text = f"{v:.{max(digits - 3, 1)}f}" if abs(v) >= 1 else f"{v:.3g}"
            return f"{text} {unit}"
    raise AssertionError("unreachable")


def format_number(v: float | int | None, digits: int = 4) -> str:
    """A figure to `digits` significant digits in plain notation: `478.1`, `0.5255`, `412,300` (thousands
    grouped from 10,000); only a figure under 0.001 keeps an exponent (`1.2e-05`). `—` when missing or NaN."""
    if v is None:
        return "—"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if math.isnan(v):
        return "—"  # a figure not measured (the bandwidth of a compute-only op is stored as NaN)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = f"{v:.{digits}g}"
    if "e" not in text:
        return text
    return f"{v:,.0f}" if 1 <= abs(v) < PLAIN_BELOW else text


def format_pct(fraction: float | None) -> str:
    """A fraction as a percentage: whole percents from 10% up, two significant digits below (`0.43%`),
    so a small share never reads as 0%. `—` when missing."""
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return "—"
    p = 100 * fraction
    if p == 0 or abs(p) >= 10:
        return f"{p:.0f}%"
    return f"{p:.2g}%"
