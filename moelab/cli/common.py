"""Shared CLI plumbing: one-line errors with exit code 2, the --db option, table printing."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import typer

from moelab.cli.fit import print_fitting
from moelab.core.display import format_time_us, safe_text
from moelab.core.errors import MoelabError
from moelab.core.terminal import terminal_console

F = TypeVar("F", bound=Callable[..., Any])

console = terminal_console()

DB_OPTION_HELP = "DuckDB file (default: $MOELAB_DB, else moelab.duckdb in the user's data directory)"
PEAKS_OPTION_HELP = "TOML file of link peaks adding to or replacing the built-in table"


MESSAGE_MAX = 1000  # characters of an error line; a 200 KB exception message is not printed whole


def fail(message: str, code: int = 2) -> typer.Exit:
    first = message.strip().splitlines()[0] if message.strip() else "error"
    if len(first) > MESSAGE_MAX:
        first = f"{first[:MESSAGE_MAX]}… ({len(first) - MESSAGE_MAX} more characters)"
    print(f"error: {safe_text(first)}", file=sys.stderr)  # messages quote user input and stored strings
    return typer.Exit(code)


def _store_error(exc: BaseException) -> bool:
    """A DuckDB error (checked without importing duckdb: commands that never open the store, such as
    `moelab doctor`, must start where duckdb is not installed)."""
    duckdb = sys.modules.get("duckdb")
    return duckdb is not None and isinstance(exc, duckdb.Error)


def user_errors(fn: F) -> F:
    """Turn MoelabError (and ValueError from specs) into one line on stderr and exit code 2; so too an
    error of the file system (a full disk, a path that cannot be written) or of the database that no
    layer below turned into a MoelabError: one line that names the cause, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MoelabError as exc:
            raise fail(str(exc)) from None
        except OSError as exc:
            where = f": {exc.filename}" if exc.filename else ""
            raise fail(f"{exc.strerror or exc}{where}") from None
        except Exception as exc:
            if _store_error(exc):
                raise fail(f"database error: {exc}") from None
            raise

    return wrapper  # type: ignore[return-value]


TIME_SUFFIX = " µs"


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A table of stored values that fits the terminal (moelab.cli.fit): every string escaped (`safe_text`:
    stored labels, reasons and names may hold control bytes), columns headed `... µs` printed in the unit
    that fits each figure; figures never wrap, text wraps between words and is never cut short."""
    times = [str(c).endswith(TIME_SUFFIX) for c in columns]
    specs = [
        (safe_text(str(c).removesuffix(TIME_SUFFIX) if t else str(c)), t)
        for c, t in zip(columns, times, strict=True)
    ]
    cells = [
        [format_time_us(v) if t and _is_number(v) else _fmt(v) for v, t in zip(r, times, strict=True)]
        for r in rows
    ]
    print_fitting(console, specs, cells, safe_text(title) if title else None)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if v != v:
            return "nan"
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.6g}"
    return safe_text(v, keep_newlines=True)  # a cell may hold several lines; control bytes stay escaped


def cuda_devices() -> int:
    """CUDA devices this host has (torch is imported here, by the commands that launch ranks)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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


def interrupted_exit(signal_name: str) -> typer.Exit:
    """The exit of a command its user stopped (SIGINT, SIGTERM): the shell's 128 + the signal's number, as
    moelab.launch.interrupt exits a run stopped twice."""
    return typer.Exit(128 + signal.Signals[signal_name])
