"""moelab's command line."""

from __future__ import annotations

import typer

from moelab import __version__
from moelab.cli import db_cmd, trace
from moelab.cli.check_cmd import check
from moelab.cli.compare_cmd import compare
from moelab.cli.doctor import doctor
from moelab.cli.info_cmds import backends, runs
from moelab.cli.ingest_cmd import ingest
from moelab.cli.label_cmd import label
from moelab.cli.report_cmd import report
from moelab.cli.run_cmd import run
from moelab.cli.tune_cmd import tune_command
from moelab.cli.verify_cmd import verify

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
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version"
    ),
) -> None:
    """moelab: benchmark, store, report and guard MoE expert-parallel dispatch/combine across backends.

    Example: moelab run --backend nccl-a2a --experts-per-rank 8 --report report.html
    """


app.command("run")(run)
app.command("verify")(verify)
app.command("tune")(tune_command)
app.command("backends")(backends)
app.command("runs")(runs)
app.command("report")(report)
app.command("compare")(compare)
app.command("check")(check)
app.command("label")(label)
app.command("ingest")(ingest)
app.command("doctor")(doctor)
app.add_typer(db_cmd.app, name="db")
app.add_typer(trace.app, name="trace")

if __name__ == "__main__":
    app()
