"""moelab's command line."""

from __future__ import annotations

import typer

from moelab import __version__
from moelab.cli import db_cmd
from moelab.cli.info_cmds import backends, runs
from moelab.cli.report_cmd import report
from moelab.cli.run_cmd import run

app = typer.Typer(
    name="moelab",
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
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version")) -> None:
    """moelab: benchmark, store, report and guard MoE expert-parallel dispatch/combine across backends."""


app.command("run")(run)
app.command("backends")(backends)
app.command("runs")(runs)
app.command("report")(report)
app.add_typer(db_cmd.app, name="db")

if __name__ == "__main__":
    app()
