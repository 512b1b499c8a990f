"""The console every command prints through: as wide as the terminal, wrapping at word boundaries.

Width: `$COLUMNS` where set (the shell's own convention, and how a test asks for 80 or 120 columns), else
the terminal's; output to a pipe or a log, with neither, is 220 columns wide so wide tables stay whole.
Long lines wrap between words (rich's soft wrap would leave them to the terminal, which cuts mid-word).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, ConsoleDimensions

from moelab.core.display import safe_text

PIPE_WIDTH = 220


class TerminalConsole(Console):
    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        columns = self._environ.get("COLUMNS")
        if self._width is not None or self.is_terminal or (columns is not None and columns.isdigit()):
            return dims
        return ConsoleDimensions(PIPE_WIDTH, dims.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """Text printed with its control characters escaped (newlines and tabs kept): a path, a label or a
        name a user gave may hold ESC/OSC bytes that retitle or clear the terminal, wherever it is printed."""
        super().print(
            *(safe_text(o, keep_newlines=True) if isinstance(o, str) else o for o in objects), **kwargs
        )


def terminal_console() -> Console:
    """Plain text (no markup, no highlighting: printed strings come from the store and from users)."""
    return TerminalConsole(highlight=False, markup=False, soft_wrap=False)
