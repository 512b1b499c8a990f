"""`moelab tune`: the backend, communication SMs, chunk knobs and schedule that give one MoE layer the most
tokens/s, found by successive halving; every trial a stored run; the winner printed as a moelab suite and
as framework settings."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import typer

from moelab.backends import registry
from moelab.cli.common import DB_OPTION_HELP, console, parse_list, print_table, user_errors
from moelab.cli.run_cmd import _cuda_devices, _parse_backend_paths
from moelab.core.errors import MoelabError, SpecError
from moelab.core.models import MODELS, model_shape
from moelab.core.spec import TimingSpec
from moelab.core.workload import RoutingSpec, Workload
from moelab.measure.e2e.layer import default_intermediate
from moelab.plan.planning import HostFacts, RunRequest, plan_world, timing_for
from moelab.store.db import check_writable, data_dir, resolve_db_path
from moelab.tune.emit import framework_settings, suite_toml, summary_lines
from moelab.tune.search import TuneConfig, tune
from moelab.tune.space import COARSE_SMS, DEFAULT_DTYPES, TUNABLE_BACKENDS, coarse
from moelab.tune.trials import plan_trials, run_round


def round_timings(
    device: str, iters: int | None, warmup: int | None
) -> tuple[TimingSpec, TimingSpec, TimingSpec]:
    """Few iterations to rank, more to refine, the full count for the final round; each as plan_run times
    a run of that many iterations on `device`."""
    rounds, final = (((10, 3), (20, 5)), (50, 10)) if device == "cuda" else (((2, 1), (3, 1)), (5, 1))
    last = (iters if iters is not None else final[0], warmup if warmup is not None else final[1])
    r1, r2, r3 = (timing_for(RunRequest(iters=i, warmup=w), device) for i, w in (*rounds, last))
    return r1, r2, r3


@user_errors
def tune_command(
    backend: str | None = typer.Option(
        None,
        help=f"Backends to search, comma-separated (default: the available ones of {', '.join(TUNABLE_BACKENDS)})",
    ),
    preset: str | None = typer.Option(
        None, help=f"Layer shape of a model (as moelab run --model): {', '.join(MODELS)}"
    ),
    hidden: int | None = typer.Option(None, help="Hidden size (default 8192, or the preset's)"),
    intermediate: int | None = typer.Option(
        None, help="Expert FFN width (default hidden/4, or the preset's)"
    ),
    tokens_per_rank: int = typer.Option(4096, "--tokens-per-rank", help="Tokens per rank"),
    topk: int | None = typer.Option(None, help="Experts per token (default 8, or the preset's)"),
    experts_per_rank: int | None = typer.Option(
        None, "--experts-per-rank", help="Experts per rank (default 8, or the preset's experts / ranks)"
    ),
    dtype: str | None = typer.Option(
        None,
        help="Dispatch payload for every backend (default: mxfp8 for mxfp8-a2a, fp8 for deepep, else bf16)",
    ),
    routing: str = typer.Option("uniform", help="Routing kind: uniform, zipf, hot"),
    seed: int = typer.Option(0, help="Routing seed"),
    sms: str | None = typer.Option(
        None, help=f"Coarse grid of communication SM counts (default {','.join(map(str, COARSE_SMS))})"
    ),
    backward: bool = typer.Option(
        False, "--backward", help="Tune forward+backward tokens/s instead of forward"
    ),
    gpus: int | None = typer.Option(
        None, "--gpus", "--nproc", help="Ranks on this host (default: every GPU; 2 on CPU)"
    ),
    cpu: bool = typer.Option(False, "--cpu", help="Run on CPU ranks (gloo) even when GPUs are present"),
    iters: int | None = typer.Option(
        None, help="Timed iterations of the final round (default 50 on GPU, 5 on CPU)"
    ),
    warmup: int | None = typer.Option(None, help="Warm-up iterations of the final round"),
    db: str | None = typer.Option(None, "--db", help=DB_OPTION_HELP),
    out: Path | None = typer.Option(
        None, "--out", help="Folder for the run directories (default: the data directory)"
    ),
    backend_path: list[str] = typer.Option(
        [],
        "--backend-path",
        help="NAME=DIR: put DIR first on PYTHONPATH for backend NAME's jobs (e.g. its deep_ep build)",
    ),
    timeout: float = typer.Option(900.0, help="Seconds one backend job of a round may take"),
    suite_out: Path | None = typer.Option(
        None, "--suite-out", help="Also write the winner's suite to this file"
    ),
) -> None:
    """Search backend x SMs x chunk knobs x schedule for the most end-to-end tokens/s of one MoE layer.

    Example: moelab tune --preset deepseek-v3 --backend deepep,hybrid-ep --backend-path deepep=.ext/deepep-v1
    """
    p = model_shape(preset) if preset else None
    paths = _parse_backend_paths(backend_path)
    asked = parse_list(backend, str, "backend")
    names: list[str] = []
    for name in asked or list(TUNABLE_BACKENDS):
        registry.resolve(name)
        reason = registry.availability(name, paths.get(name))
        if reason and asked:
            raise MoelabError(f"backend {name} is unavailable: {reason}")
        if reason:
            console.print(f"skipping {name}: {reason}")
            continue
        names.append(name)
    if not names:
        raise MoelabError("no backend to tune is available here")
    grid = tuple(parse_list(sms, int, "sms") or COARSE_SMS)
    if any(not isinstance(s, int) or s < 1 for s in grid):
        raise SpecError("--sms takes positive whole numbers (the library default is always tried)")
    host = HostFacts(cuda_devices=_cuda_devices())
    request = RunRequest(backends=tuple(names), gpus=gpus, cpu=cpu, iters=iters, warmup=warmup, backend_paths=paths,
                         timeout_s=timeout, health=False, command=("moelab", *sys.argv[1:]))  # fmt: skip
    device, world = plan_world(request, host)
    h = hidden if hidden is not None else (p.hidden if p else 8192)
    inter = intermediate if intermediate is not None else (p.intermediate if p else default_intermediate(h))
    k = topk if topk is not None else (p.topk if p else 8)
    epr = (
        experts_per_rank
        if experts_per_rank is not None
        else (p.experts_per_rank(world, "--preset") if p else 8)
    )
    wl = Workload(
        hidden=h, tokens_per_rank=tokens_per_rank, topk=k, experts_per_rank=epr, dtype=dtype or "bf16",
        routing=RoutingSpec(kind=routing, seed=seed),
    )  # fmt: skip
    sm_control = device == "cuda"
    timings = round_timings(device, iters, warmup)
    db_path = resolve_db_path(db)
    tune_id = secrets.token_hex(3)
    plan = plan_trials(
        request=request, host=host, workload=wl, intermediate=inter, backward=backward,
        dtypes={b: dtype for b in TUNABLE_BACKENDS} if dtype else dict(DEFAULT_DTYPES),
        first=coarse(names, grid, sm_control), final=timings[2], runs_root=out or (data_dir() / "runs"),
        db_path=db_path, tune_id=tune_id,
    )  # fmt: skip
    check_writable(db_path)
    config = TuneConfig(backends=tuple(names), sms_grid=grid, sm_control=sm_control, timings=timings)
    console.print(
        f"tune {tune_id}: hidden {h}, intermediate {inter}, {tokens_per_rank} tokens/rank, topk {k}, "
        f"{epr} experts/rank, {plan.launch.world} {device} ranks; backends {', '.join(names)}"
        + ("" if sm_control else " (CPU ranks: no SM control, searching backends, schedules and knobs)")
    )
    result = tune(config, lambda n, cands, timing: run_round(plan, n, cands, timing, progress=console.print))
    print_table(
        ["round", "backend", "mode", "sms", "knobs", "tokens/s/rank", "status", "run"],
        [
            (t.round, t.candidate.backend, t.candidate.mode, t.candidate.sms if t.candidate.sms is not None else "default",
             ", ".join(f"{a}={b}" for a, b in t.candidate.knobs) or "—", t.tokens_per_s, t.status, t.run_id)
            for t in result.trials
        ],
        title=f"tune {tune_id}: every trial (stored; labels {plan.round_label(1)} …)",
    )  # fmt: skip
    for line in summary_lines(plan, result):
        console.print(line)
    toml = suite_toml(plan, result.winner)
    console.print("\n# the winner as a moelab suite:", markup=False)
    console.print(toml, markup=False, highlight=False)
    console.print("# the winner as framework settings:", markup=False)
    for line in framework_settings(plan, result.winner):
        console.print(f"  {line}", markup=False, highlight=False)
    if suite_out is not None:
        suite_out.write_text(toml)
        console.print(f"suite written to {suite_out}")
