"""Tables that fit the terminal without cutting a name or breaking a word.

rich shrinks a table that is too wide by folding words mid-way or eliding them ("dispa…"); a name cut
short reads as another name. So a table is laid out, in turn, as a boxed table, a compact one, one table
per value of its longest column (that value as a heading above it), and last as one block per row
(`column  value` lines): the first layout that keeps every word whole at the console's width is printed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from itertools import groupby

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text


def keep_words_whole(table: Table) -> Table:
    """Each wrapping column at least as wide as its longest word: rich then wraps between words and,
    where the table is too wide, narrows the columns that can wrap without folding a word in two."""
    for col in table.columns:
        if not col.no_wrap:
            words = [w for cell in [col.header, *col.cells] for w in str(cell).split()]
            col.min_width = max((cell_len(w) for w in words), default=1)
    return table


def _words(renderable: RenderableType) -> Counter[str]:
    if isinstance(renderable, Table):
        cells = [str(renderable.title or "")]
        for col in renderable.columns:
            cells += [str(col.header), *(str(c) for c in col.cells)]
        return Counter(w for cell in cells for w in cell.split())
    if isinstance(renderable, Group):
        total: Counter[str] = Counter()
        for r in renderable.renderables:
            total += _words(r)
        return total
    return Counter(str(renderable).split())


def unbroken(renderable: RenderableType, console: Console) -> bool:
    """Whether `renderable`, printed at the console's width, keeps every word whole and no line wider
    than the console (rich folds a word that no column width can hold, and only then)."""
    with console.capture() as capture:
        console.print(renderable)
    text = capture.get()
    printed = Counter(text.split())
    return all(printed[w] >= n for w, n in _words(renderable).items()) and all(
        cell_len(line) <= console.width for line in text.splitlines()
    )


def first_fitting(console: Console, builders: Sequence[Callable[[], RenderableType]]) -> RenderableType:
    """The first layout that fits unbroken; the last one whatever the width."""
    built: RenderableType = ""
    for build in builders:
        built = build()
        if isinstance(built, Table):
            keep_words_whole(built)
        if unbroken(built, console):
            return built
    return built


HOIST_FROM = 12  # characters: a column this wide is worth a heading of its own
ColumnSpec = tuple[str, bool]  # header, figure (right-aligned, never wrapped)


def boxed(
    columns: Sequence[ColumnSpec], rows: Sequence[Sequence[str]], title: str | None, style: box.Box
) -> Table:
    table = Table(title=title, box=style, title_justify="left")
    for name, figure in columns:
        table.add_column(name, no_wrap=figure, justify="right" if figure else "left", overflow="fold")
    for r in rows:
        table.add_row(*r)
    return table


def hoisted(
    columns: Sequence[ColumnSpec], rows: Sequence[Sequence[str]], title: str | None, count: int
) -> RenderableType:
    """The `count` widest text columns taken out of the table: their values head each run of rows that
    share them."""
    widths = [
        max((cell_len(r[i]) for r in rows), default=0) if not figure else -1
        for i, (_, figure) in enumerate(columns)
    ]
    # first a long text column whose value repeats most (a case id, a workload), else the widest
    runs = {i: sum(1 for _ in groupby(r[i] for r in rows)) for i in range(len(columns))}
    long = [i for i, w in enumerate(widths) if w >= HOIST_FROM]
    widest = (
        min(long, key=lambda i: (runs[i], -widths[i]))
        if long
        else max(range(len(columns)), key=lambda i: widths[i])
    )
    # then the names that repeat most (fewest distinct values: a backend, not an op), never a mark column
    names = [
        i
        for i, (h, _) in enumerate(columns)
        if i != widest and h and widths[i] > 4 and any(ch.isalpha() for r in rows for ch in r[i])
    ]
    names.sort(key=lambda i: (runs[i], -widths[i]))
    keys = sorted([widest, *names[: count - 1]])
    rest = [c for i, c in enumerate(columns) if i not in keys]
    parts: list[RenderableType] = [Text(title)] if title else []
    for values, group in groupby(rows, key=lambda r: tuple(r[k] for k in keys)):
        parts.append(Text(", ".join(f"{columns[k][0]} {v}" for k, v in zip(keys, values, strict=True))))
        table = boxed(
            rest, [[c for i, c in enumerate(r) if i not in keys] for r in group], None, box.SIMPLE_HEAD
        )
        table.pad_edge, table.collapse_padding = False, True
        if count > 1:  # the narrowest: no rules, one space between columns
            table.box = None
        parts.append(keep_words_whole(table))
    return Group(*parts)


def blocks(columns: Sequence[ColumnSpec], rows: Sequence[Sequence[str]], title: str | None) -> RenderableType:
    """One block per row: a `column  value` line for each column, values wrapped between words."""
    parts: list[RenderableType] = [Text(title)] if title else []
    for r in rows:
        grid = Table(box=None, show_header=False, pad_edge=False)
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column(overflow="fold")
        for (name, _), value in zip(columns, r, strict=True):
            grid.add_row(name or "mark", value)
        parts += [keep_words_whole(grid), Text("")]
    return Group(*parts)


def print_fitting(
    console: Console, columns: Sequence[ColumnSpec], rows: Sequence[Sequence[str]], title: str | None = None
) -> None:
    console.print(
        first_fitting(
            console,
            [
                lambda: boxed(columns, rows, title, box.HEAVY_HEAD),
                lambda: boxed(columns, rows, title, box.SIMPLE_HEAD),
                lambda: hoisted(columns, rows, title, 1),
                lambda: hoisted(columns, rows, title, 2),
                lambda: blocks(columns, rows, title),
            ],
        )
    )
