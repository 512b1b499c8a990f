"""Shared CLI plumbing: one-line errors with exit code 2, the --db option, table printing."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from moelab.errors import MoelabError

F = TypeVar("F", bound=Callable[..., Any])

console = Console(highlight=False, markup=False, soft_wrap=True, width=None if sys.stdout.isatty() else 220)

DB_OPTION_HELP = "DuckDB file (default: $MOELAB_DB, else moelab.duckdb in the user's data directory)"


def fail(message: str, code: int = 2) -> typer.Exit:
    first = message.strip().splitlines()[0] if message.strip() else "error"
    print(f"error: {first}", file=sys.stderr)
    return typer.Exit(code)


def user_errors(fn: F) -> F:
    """Turn MoelabError (and ValueError from specs) into one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MoelabError as exc:
            raise fail(str(exc)) from None

    return wrapper  # type: ignore[return-value]


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    table = Table(title=title, show_lines=False)
    for c in columns:
        table.add_column(str(c), overflow="fold")
    for r in rows:
        table.add_row(*[_fmt(v) for v in r])
    console.print(table)


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if v != v:
            return "nan"
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.6g}"
    return str(v)


def parse_list(value: str | None, kind: type = str, name: str = "value") -> list[Any] | None:
    """'8,16,24' → [8, 16, 24]; 'default' stays a string for --sms."""
    if value is None:
        return None
    out: list[Any] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if kind is int and part != "default":
            try:
                out.append(int(part))
            except ValueError:
                raise MoelabError(f"--{name} takes whole numbers separated by commas, got {part!r}") from None
        elif kind is float:
            try:
                out.append(float(part))
            except ValueError:
                raise MoelabError(f"--{name} takes numbers separated by commas, got {part!r}") from None
        else:
            out.append(part)
    if not out:
        raise MoelabError(f"--{name} is empty")
    return out
