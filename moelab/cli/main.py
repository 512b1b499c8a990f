"""moelab's command line.

Commands are imported only when they run (or when their own --help is asked for): `moelab run` needs
torch, `moelab check` the gate's statistics, `moelab report` the charts, but `moelab --help` and
`moelab runs` need none of them and start in a fraction of a second. The top-level help lists each
command from the table below, whose one-line summaries a test keeps equal to the commands' docstrings.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

import typer
import typer.main
from typer import _click
from typer.core import TyperCommand, TyperGroup

from moelab import __version__


@dataclass(frozen=True, slots=True)
class LazyCommand:
    target: str  # "module:attribute": a command function, or a typer.Typer for a group
    summary: str  # the first line of its docstring (or the group's help), shown by `moelab --help`


COMMANDS: dict[str, LazyCommand] = {
    "run": LazyCommand(
        "moelab.cli.run_cmd:run",
        "Run dispatch/combine benchmarks: each backend as its own job, results stored in DuckDB.",
    ),
    "backends": LazyCommand(
        "moelab.cli.info_cmds:backends",
        "List every backend (built-in and plugins) and whether it can run here, or why not.",
    ),
    "verify": LazyCommand(
        "moelab.cli.verify_cmd:verify",
        "Check moelab's figures against each library's own benchmark at the same configuration.",
    ),
    "tune": LazyCommand(
        "moelab.cli.tune_cmd:tune_command",
        "Search backend x SMs x chunk knobs x schedule for the most end-to-end tokens/s of one MoE layer.",
    ),
    "ingest": LazyCommand(
        "moelab.cli.ingest_cmd:ingest",
        "Store a run directory in the database; a run already stored is left as it is (exit 0).",
    ),
    "runs": LazyCommand("moelab.cli.info_cmds:runs", "List stored runs, newest first."),
    "report": LazyCommand(
        "moelab.cli.report_cmd:report",
        "Render a report of one run (or several), or the history of many runs as trends with detected steps.",
    ),
    "compare": LazyCommand(
        "moelab.cli.compare_cmd:compare",
        "Compare cases side by side, matched on workload and SMs, with bandwidth as a fraction of each GPU's link peak.",
    ),
    "model": LazyCommand(
        "moelab.cli.model_cmd:model",
        "Compute the lower-bound dispatch and combine time of a topology and workload, per dispatch family, from the bytes each link carries.",
    ),
    "check": LazyCommand(
        "moelab.cli.check_cmd:check",
        "Check a run against a baseline: fail on a slowdown past the threshold that is outside the noise.",
    ),
    "label": LazyCommand(
        "moelab.cli.label_cmd:label",
        "Give a run a name (moving the name if another run had it), list names, or remove one.",
    ),
    "doctor": LazyCommand(
        "moelab.cli.doctor:doctor",
        "Check GPUs (throttling, clocks under load, ECC, NVLink, PCIe), GPU paths, NICs (ports, PCIe AtomicOps, "
        "NUMA) and CPU affinity; name the slowest GPUs across nodes.",
    ),
    "db": LazyCommand("moelab.cli.db_cmd:app", "Query and export the DuckDB store."),
    "trace": LazyCommand(
        "moelab.cli.trace:app",
        "Summarise profiler traces: API time, kernel-only time and kernel shares per range.",
    ),
}


def load_target(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


# options whose empty value means something (the help says what): every other empty value is refused
EMPTY_MEANS_SOMETHING = frozenset({"--prefix"})


class NoEmptyValues(TyperCommand):
    """A command that refuses an empty value (`--db ''`, `--out=`, an empty argument) before it runs.

    The commands read an option's value by its truth, so an empty one would be taken as not given: `--db
    "$DB"` with DB unset would write into the user's own store, `check --run ''` judge the newest run."""

    def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
        opts, _, order = self.make_parser(ctx).parse_args(args=list(args))
        _refuse_repeats(ctx, order)
        for param in self.get_params(ctx):
            given = opts.get(param.name) if param.name else None
            values = given if isinstance(given, list | tuple) else [given]
            if "" in values and not EMPTY_MEANS_SOMETHING.intersection(param.opts):
                name = next((o for o in param.opts if o.startswith("--")), (param.name or "").upper())
                raise _click.exceptions.UsageError(f"{name} is empty", ctx)
        return super().parse_args(ctx, args)


def _refuse_repeats(ctx: _click.Context, order: list[_click.Parameter]) -> None:
    """An option that takes one value, given twice, is refused: click keeps the last without a word, so
    `check -B v1 -B v2` judged against v2 alone and `--health --no-health` read as whichever came last.
    Options that take many (`--case`, `--from`, `--run`) are repeatable by design and left alone."""
    seen: set[str] = set()
    for param in order:
        option = getattr(param, "param_type_name", None) == "option"  # typer's own or click's Option
        if not option or param.multiple or getattr(param, "count", False) or param.name is None:
            continue
        if param.name in seen:
            opts = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("-")]
            names = "/".join(sorted(opts, key=lambda o: not o.startswith("--")))  # --baseline/-B
            raise _click.exceptions.UsageError(f"{names} is given more than once: give it once", ctx)
        seen.add(param.name)


def _refuse_empty_values(command: _click.Command) -> None:
    """Every command of `command` (a group's too) a NoEmptyValues: typer builds them as TyperCommand."""
    if type(command) is TyperCommand:
        command.__class__ = NoEmptyValues
    for sub in getattr(command, "commands", {}).values():
        _refuse_empty_values(sub)


def build_command(name: str, entry: LazyCommand) -> _click.Command:
    """The real click command (or group) for `name`, importing its module."""
    from moelab.cli import metavars

    obj = load_target(entry.target)
    command: _click.Command
    if isinstance(obj, typer.Typer):
        command = typer.main.get_group(obj)
        command.name = name
    else:
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        single.command(name)(obj)
        command = typer.main.get_command(single)
    metavars.fill(command)
    _refuse_empty_values(command)
    return command


class LazyGroup(TyperGroup):
    """A typer group whose commands are placeholders until one is resolved to run or to show its help."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._listing = False
        for name, entry in COMMANDS.items():
            self.commands.setdefault(
                name, TyperCommand(name=name, help=entry.summary, short_help=entry.summary)
            )
        self._loaded: set[str] = set()

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return list(COMMANDS)

    def load(self, name: str) -> _click.Command | None:
        entry = COMMANDS.get(name)
        if entry is None:
            return self.commands.get(name)
        if name not in self._loaded:
            self.commands[name] = build_command(name, entry)
            self._loaded.add(name)
        return self.commands[name]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if self._listing:
            return self.commands.get(cmd_name)
        return self.load(cmd_name)

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: Any = None,
        complete_var: Any = None,
        standalone_mode: bool = True,
        **kwargs: Any,
    ) -> Any:
        """click's own handling, except that a usage error (a bad flag value, an unknown option) is one
        `error:` line and exit 2 like every other user error, not a usage box."""
        passed = {"args": args, "prog_name": prog_name, "complete_var": complete_var, **kwargs}
        if not standalone_mode:
            return super().main(standalone_mode=False, **passed)
        try:
            code = super().main(standalone_mode=False, **passed)
        except typer.Abort:
            print("error: aborted", file=sys.stderr)
            sys.exit(130)
        except Exception as exc:
            # click's usage and parameter errors, by their public shape (no import of click internals)
            exit_code = getattr(exc, "exit_code", None)
            if not (hasattr(exc, "format_message") and isinstance(exit_code, int)):
                raise
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None and exit_code == 2 else ""
            print(f"error: {exc.format_message()}{hint}", file=sys.stderr)
            sys.exit(exit_code)
        sys.exit(code if isinstance(code, int) else 0)

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        for param in [*self.params, self.get_help_option(ctx)]:  # --version and --help take nothing
            if param is not None and param.metavar is None:
                param.metavar = ""
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="moelab",
    cls=LazyGroup,
    help="moelab: benchmark, store, report and guard MoE expert-parallel dispatch/combine across backends.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"moelab {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version"
    ),
) -> None:
    """moelab: benchmark, store, report and guard MoE expert-parallel dispatch/combine across backends.

    Example: moelab run --backend nccl-a2a --experts-per-rank 8 --report report.html
    """


if __name__ == "__main__":
    app()
