"""Input checks that decide exit codes: empty runs, repeated backends, run ids, labels."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moelab.core.errors import SpecError
from moelab.core.validate import dedupe_backends, nothing_measured, validate_label, validate_run_id


def test_nothing_measured_when_every_case_is_unsupported_or_skipped() -> None:
    reason = nothing_measured(["unsupported", "skipped", "unsupported"])
    assert reason is not None
    assert reason.startswith("nothing was measured")
    assert "2 unsupported" in reason and "1 skipped" in reason and "--allow-empty" in reason


@pytest.mark.parametrize(
    "statuses", [["ok"], ["unsupported", "ok"], ["failed"], ["skipped", "incorrect"], []]
)
def test_something_measured_or_nothing_to_say(statuses: list[str]) -> None:
    assert nothing_measured(statuses) is None


def test_dedupe_backends_keeps_order_and_refuses_repeats() -> None:
    assert dedupe_backends(["deepep", "nccl-a2a"]) == ["deepep", "nccl-a2a"]
    with pytest.raises(SpecError, match="nccl-a2a more than once"):
        dedupe_backends(["nccl-a2a", "deepep", "nccl-a2a", "nccl-a2a"])


@pytest.mark.parametrize("good", ["20260101T000000Z-abc123", "pr-42", "a", "run_1.2", "A" * 128])
def test_plain_run_ids_pass(good: str) -> None:
    assert validate_run_id(good) == good


@pytest.mark.parametrize(
    "bad",
    [
        "../../escaped-run",
        "a/b",
        "a\\b",
        "..",
        "a..b",
        ".hidden",
        "-flag",
        "",
        "a b",
        "x\x1b",
        "A" * 129,
        "é",
    ],
)
def test_run_ids_that_could_escape_or_confuse_are_refused(bad: str) -> None:
    with pytest.raises(SpecError, match="not a plain name"):
        validate_run_id(bad)


@given(st.text(max_size=40))
def test_an_accepted_run_id_is_one_path_component(s: str) -> None:
    try:
        validate_run_id(s)
    except SpecError:
        return
    assert "/" not in s and "\\" not in s and s not in (".", "..") and s.isascii()


def test_labels_with_control_characters_are_refused() -> None:
    with pytest.raises(SpecError, match="control characters.*U\\+001B"):
        validate_label("\x1b[31mRED\x1b]0;pwned-title\x07\x1b[2J")
    with pytest.raises(SpecError, match="control"):
        validate_label("a\u2028b")
    with pytest.raises(SpecError, match="empty"):
        validate_label("   ")
    with pytest.raises(SpecError, match="at most"):
        validate_label("x" * 201)
    assert validate_label("  pr-42 baseline ✓ ") == "pr-42 baseline ✓"
