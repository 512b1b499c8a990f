"""What each option takes, in --help.

typer 0.29 shows an option without a metavar by its Python type: `<bool>` beside every on/off flag and
`--help` itself, `<str>` beside a file or a run id. moelab's shared flags declare what they take
(moelab.cli.options.Flag.metavar); for every other option of every command this fills in the rest once
the command is built: nothing for a flag, and a word for the type (N, NUMBER, TEXT, PATH) where the option
declared none (an argument shows its own name).
"""

from __future__ import annotations

from typing import Any

from typer import _click

# options many commands declare alike, whose type alone says little
BY_OPTION = {
    "--db": "FILE",
    "--run": "RUN",
    "--from-run": "RUN",
    "--label": "NAME",
    "--peaks": "FILE",
    "--backend": "NAME[,NAME…]",
    "--gpu": "NAME",
    "--nic": "NAME",
    "--since": "DATE|SPAN",
    "--baseline": "RUN|LABEL|DIR",
}
BY_CLICK_TYPE = {
    "integer": "N",
    "int": "N",
    "float": "NUMBER",
    "text": "TEXT",
    "str": "TEXT",
    "path": "PATH",
    "datetime": "DATE",
}
BY_TYPE = {"int": "N", "float": "NUMBER", "str": "TEXT", "path": "PATH", "Path": "PATH", "datetime": "DATE"}


def _word(display: str) -> str | None:
    """`<list[Path]>` -> PATH, `<int>` -> N; None for a display that is already words (choices)."""
    inner = display.strip("<>.")
    if inner.startswith("list[") and inner.endswith("]"):
        inner = inner[5:-1]
    return BY_TYPE.get(inner)


def _fill_option(param: Any, ctx: _click.Context) -> None:
    if param is None or getattr(param, "param_type_name", None) != "option" or param.metavar is not None:
        return
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.metavar = ""
        return
    long = next((o for o in param.opts if o.startswith("--")), "")
    word = BY_OPTION.get(long) or _type_word(param, ctx)
    if word is not None:
        param.metavar = word


def _type_word(param: Any, ctx: _click.Context) -> str | None:
    """The word for an option's type: typer 0.29 describes it with `display_type`; earlier releases (0.27
    on the GPU machines) keep click's ParamType in `type`, named integer, float, text, path..."""
    display = getattr(param, "display_type", None)
    if callable(display):
        return _word(str(display(ctx) or ""))
    return BY_CLICK_TYPE.get(getattr(getattr(param, "type", None), "name", ""))


def fill(command: _click.Command) -> None:
    """Give every option of `command` (and of its subcommands) that declared no metavar one that says
    what it takes; --help and flags take nothing."""
    ctx = _click.Context(command)
    for param in [*command.params, command.get_help_option(ctx)]:
        _fill_option(param, ctx)
    for sub in getattr(command, "commands", {}).values():
        fill(sub)
