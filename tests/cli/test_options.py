"""`run`, `verify` and `tune` take their shared flags from one declaration each (moelab/cli/options.py): the
same option names and, where a command does not say otherwise, the same help; a flag a command does not
offer keeps its group's default, the RunRequest's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from moelab.cli import options as opt
from moelab.cli.main import COMMANDS, build_command
from moelab.plan.planning import RunRequest


def _params(name: str) -> dict[str, Any]:
    return {p.name: p for p in build_command(name, COMMANDS[name]).params}


def test_the_commands_share_each_flags_declaration() -> None:
    run, verify, tune = _params("run"), _params("verify"), _params("tune")
    shared = {
        "backend",
        "backend_path",
        "hidden",
        "tokens_per_rank",
        "topk",
        "experts_per_rank",
        "dtype",
        "sms",
        "gpus",
        "cpu",
        "iters",
        "warmup",
        "timeout",
        "db",
        "out",
    }
    assert shared <= set(run) & set(verify) & set(tune)
    for name in shared:
        assert set(verify[name].opts) <= set(run[name].opts) and set(tune[name].opts) <= set(
            run[name].opts
        ) | {"--nproc"}
    assert run["db"].help == verify["db"].help == tune["db"].help == opt.DB.help
    assert (
        run["cpu"].help == tune["cpu"].help == opt.CPU.help != verify["cpu"].help
    )  # verify says what it means
    assert run["report"].help == verify["report"].help and run["health"].opts == verify["health"].opts


def test_a_flag_a_command_does_not_offer_keeps_the_request_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    fields = {
        **opt.LaunchOptions().request_fields(),
        **opt.TimingOptions().request_fields(),
        **opt.StoreOptions().request_fields(),
        **opt.TraceOptions().request_fields(),
        **opt.HealthOptions().request_fields(),
    }
    defaults = RunRequest()
    assert fields == {k: getattr(defaults, k) for k in fields}
    assert (
        opt.LaunchOptions(launcher="auto").request_fields()["launcher"] == "slurm"
    )  # run's default, resolved


def test_a_command_takes_exactly_the_flags_it_lists() -> None:
    def shows(launch: opt.LaunchOptions, quiet: bool) -> tuple[opt.LaunchOptions, bool]:
        return launch, quiet

    quiet = opt.Flag("quiet", bool, False, ("--quiet",), "Say less")
    built = opt.command(opt.GPUS, opt.CPU, quiet)(shows)
    assert list(built.__signature__.parameters) == ["gpus", "cpu", "quiet"]  # type: ignore[attr-defined]
    launch, said = built(gpus=4, cpu=True, quiet=False)
    assert (launch, said) == (opt.LaunchOptions(gpus=4, cpu=True), False)
    with pytest.raises(TypeError, match="do not match"):
        opt.command(opt.GPUS)(shows)


@pytest.mark.parametrize(
    "command", [[], *([name] for name in COMMANDS), ["db", "export"], ["trace", "summarize"]]
)
def test_help_says_what_each_flag_takes(command: list[str]) -> None:
    """No `<bool>` beside an on/off flag or --help, no bare Python type beside an option (arguments show
    their names)."""
    import re

    from typer.testing import CliRunner

    from moelab.cli.main import app

    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    options = [x for x in result.output.splitlines() if re.match(r"│ (\*\s+)?-", x)]
    assert options and not any(
        re.search(r"<(bool|str|int|float|path|Path|list\[[^]]*\])>", x) for x in options
    )


def test_shared_flags_declare_their_metavar() -> None:
    from typer.testing import CliRunner

    from moelab.cli.main import app

    text = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    for flag, meta in (
        ("--timeout", "SECONDS"),
        ("--sms", "N|default[,…]"),
        ("--db", "FILE"),
        ("--rdzv-endpoint", "HOST:PORT"),
    ):
        assert re.search(rf"{re.escape(flag)}\s+(-\w\s+)?{re.escape(meta)}", text), flag
    assert re.search(r"--cpu\s+Run on CPU ranks", text)  # an on/off flag takes nothing


@dataclass(frozen=True, kw_only=True)
class _TimingWithSettle(opt.TimingOptions):
    """TimingOptions with one flag more, declared as README's Development section shows."""

    settle: float | None = opt.flag(None, "Seconds to wait before timing", "--settle", metavar="SECONDS")


def _settle_command(timing: _TimingWithSettle, quiet: bool) -> None:
    print(f"request {timing.request_fields()}")


def test_a_new_flag_is_one_declaration() -> None:
    """One field with `opt.flag` gives the typer parameter (name, type, default, help, panel) and the request
    field; no tuple, no second default, no slice to shift. The command lists the group, not the flag."""
    flags = _TimingWithSettle.flags()
    assert [f.name for f in flags] == [*(f.name for f in opt.TimingOptions.flags()), "settle"]
    settle = _TimingWithSettle.flag("settle")
    assert settle == opt.Flag(
        "settle",
        float | None,
        None,
        ("--settle",),
        "Seconds to wait before timing",
        opt.TIMING_PANEL,
        _TimingWithSettle,
        "SECONDS",
    )
    app = typer.Typer()
    quiet = opt.Flag("quiet", bool, False, ("--quiet",), "Say less")
    app.command()(opt.command(*flags, quiet)(_settle_command))
    res = CliRunner().invoke(app, ["--settle", "2.5", "--iters", "7"])
    assert res.exit_code == 0, res.output
    assert "'iters': 7" in res.stdout and "'settle': 2.5" in res.stdout
    res = CliRunner().invoke(app, ["--help"])
    assert "--settle" in res.stdout and "Seconds to wait before timing" in res.stdout


def test_every_group_field_is_a_declared_flag_and_fills_a_request_field() -> None:
    from dataclasses import fields

    groups = [
        opt.BackendOptions,
        opt.WorkloadOptions,
        opt.LaunchOptions,
        opt.SbatchOptions,
        opt.TimingOptions,
        opt.StoreOptions,
        opt.TraceOptions,
        opt.HealthOptions,
    ]
    request = {f.name for f in fields(RunRequest)}
    for group in groups:
        assert [f.name for f in group.flags()] == [f.name for f in fields(group)]
    for group in (
        opt.LaunchOptions,
        opt.TimingOptions,
        opt.StoreOptions,
        opt.TraceOptions,
        opt.HealthOptions,
    ):
        assert set(group().request_fields()) <= request, group
