"""The metavar filler works across typer releases: typer 0.29 describes an option's type with
`display_type`, 0.27 (the GPU machines' image) keeps click's ParamType in `type`. Round 5's first GPU call
found `moelab report` crashing there on the missing `display_type`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from moelab.cli import metavars


def _option(**attrs: Any) -> SimpleNamespace:
    base: dict[str, Any] = dict(
        param_type_name="option", metavar=None, is_flag=False, count=False, opts=["--x"]
    )
    return SimpleNamespace(**{**base, **attrs})


@pytest.mark.parametrize(
    "click_name, word",
    [
        ("integer", "N"),
        ("int", "N"),
        ("float", "NUMBER"),
        ("str", "TEXT"),
        ("text", "TEXT"),
        ("path", "PATH"),
    ],
)
def test_an_option_without_display_type_gets_its_word_from_its_click_type(click_name: str, word: str) -> None:
    param = _option(type=SimpleNamespace(name=click_name))
    metavars._fill_option(param, None)  # type: ignore[arg-type]
    assert param.metavar == word


def test_display_type_is_used_where_typer_has_it() -> None:
    param = _option(display_type=lambda ctx: "<int>")
    metavars._fill_option(param, None)  # type: ignore[arg-type]
    assert param.metavar == "N"


def test_an_option_with_neither_keeps_typers_own_rendering() -> None:
    param = _option()
    metavars._fill_option(param, None)  # type: ignore[arg-type]
    assert param.metavar is None
    flag = _option(is_flag=True)
    metavars._fill_option(flag, None)  # type: ignore[arg-type]
    assert flag.metavar == ""
