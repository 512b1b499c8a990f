"""Terminal-safe strings and times in the unit that fits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moelab.core.display import format_time_us, safe_text


def _has_control(s: str, allow: str = "") -> bool:
    return any((ord(c) < 32 or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029") and c not in allow for c in s)


def test_escape_sequences_become_visible_text() -> None:
    hostile = "\x1b[31mRED\x1b]0;pwned-title\x07\x1b[2J"
    assert safe_text(hostile) == "\\x1b[31mRED\\x1b]0;pwned-title\\x07\\x1b[2J"
    assert safe_text("a\nb\tc") == "a\\x0ab\\x09c"
    assert safe_text("a\nb\tc\x1b", keep_newlines=True) == "a\nb\tc\\x1b"
    assert safe_text(None) == ""
    assert safe_text("µs ✓ plain") == "µs ✓ plain"


@given(st.text())
def test_safe_text_never_holds_control_characters(s: str) -> None:
    assert not _has_control(safe_text(s))
    assert not _has_control(safe_text(s, keep_newlines=True), allow="\n\t")


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E)))
def test_printable_text_is_unchanged(s: str) -> None:
    assert safe_text(s) == s


@pytest.mark.parametrize(
    "us,text",
    [
        (279600.0, "279.6 ms"),
        (2.796e5, "279.6 ms"),
        (88.5, "88.5 µs"),
        (999.99, "1 ms"),
        (2.5e6, "2.5 s"),
        (0.25, "250 ns"),
        (0.0, "0 µs"),
        (None, "—"),
        (float("nan"), "nan"),
    ],
)
def test_format_time_us_picks_the_unit(us: float | None, text: str) -> None:
    assert format_time_us(us) == text


@given(st.floats(min_value=1e-3, max_value=1e9))
def test_formatted_figure_stays_between_1_and_1000(us: float) -> None:
    value, unit = format_time_us(us).split()
    assert unit in ("ns", "µs", "ms", "s")
    assert 1 <= float(value) < 1000 or unit == "s"


@pytest.mark.parametrize(
    "us,text", [(3.6e300, "3.6e+294 s"), (5e10, "50000.0 s"), (-3e300, "-3e+294 s"), (2e18, "2e+12 s")]
)
def test_a_huge_time_keeps_its_exponent(us: float, text: str) -> None:
    """A bound at a link rate of 1e-300 GB/s printed as a 295-digit number of seconds."""
    assert format_time_us(us) == text


def test_a_huge_number_keeps_its_exponent() -> None:
    from moelab.core.display import format_number

    assert format_number(3.6e300) == "3.6e+300" and format_number(5e10) == "50,000,000,000"


def test_a_nan_figure_reads_as_missing() -> None:
    """`report --history` printed a raw `nan` for the bandwidth of compute-only ops."""
    from moelab.core.display import format_number

    assert format_number(float("nan")) == "—" and format_number(None) == "—"
