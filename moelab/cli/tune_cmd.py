"""`moelab tune`: the backend, communication SMs, chunk knobs and schedule that give one MoE layer the most
tokens/s, found by successive halving; every trial a stored run; the winner printed as a moelab suite and
as framework settings."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from moelab.backends import registry
from moelab.cli import options as opt
from moelab.cli.common import (
    console,
    cuda_devices,
    interrupted_exit,
    parse_list,
    print_table,
    user_errors,
)
from moelab.cli.output_check import check_output_file, check_outputs
from moelab.core.e2e_spec import MODES, default_intermediate
from moelab.core.errors import MoelabError, SpecError
from moelab.core.models import MODELS, ModelShape, model_shape
from moelab.core.spec import TimingSpec
from moelab.core.workload import MAX_SMS, ROUTING_KINDS, RoutingSpec, Workload
from moelab.plan.planning import HostFacts, RunRequest, plan_world, timing_for
from moelab.store.db import check_writable, resolve_db_path
from moelab.tune.emit import framework_settings, suite_toml, summary_lines
from moelab.tune.search import TuneConfig, TuneResult, tune
from moelab.tune.space import COARSE_SMS, SCHEDULES, coarse, default_dtypes, tunable_backends
from moelab.tune.trials import TrialPlan, TuneInterrupted, plan_trials, run_round


def round_timings(
    device: str, iters: int | None, warmup: int | None
) -> tuple[TimingSpec, TimingSpec, TimingSpec]:
    """Few iterations to rank, more to refine, the full count for the final round; each as plan_run times
    a run of that many iterations on `device`."""
    rounds, final = (((10, 3), (20, 5)), (50, 10)) if device == "cuda" else (((2, 1), (3, 1)), (5, 1))
    last = (iters if iters is not None else final[0], warmup if warmup is not None else final[1])
    r1, r2, r3 = (timing_for(RunRequest(iters=i, warmup=w), device) for i, w in (*rounds, last))
    return r1, r2, r3


def _flags() -> tuple[opt.Flag, ...]:
    """tune's flags: the shared ones as tune means them (one layer shape, integers), its own in between."""
    tunable, dtypes = tunable_backends(), default_dtypes()
    payloads = ", ".join(f"{d} for {name}" for name, d in dtypes.items())
    return (
        opt.BACKEND.but(
            decls=(),
            help=f"Backends to search, comma-separated (default: the available ones of {', '.join(tunable)})",
        ),
        opt.Flag(
            "preset",
            str | None,
            None,
            (),
            f"Layer shape of a model (as moelab run --model): {', '.join(MODELS)}",
            metavar="MODEL",
        ),
        opt.HIDDEN.but(
            annotation=int | None, help="Hidden size (default 8192, or the preset's)", metavar="N"
        ),
        opt.Flag(
            "intermediate",
            int | None,
            None,
            (),
            "Expert FFN width (default hidden/4, or the preset's)",
            metavar="N",
        ),
        opt.TOKENS_PER_RANK.but(annotation=int, default=4096, help="Tokens per rank", metavar="N"),
        opt.TOPK.but(
            annotation=int | None, help="Experts per token (default 8, or the preset's)", metavar="N"
        ),
        opt.EXPERTS_PER_RANK.but(
            annotation=int | None,
            help="Experts per rank (default 8, or the preset's experts / ranks)",
            metavar="N",
        ),
        opt.DTYPE.but(
            help=f"Dispatch payload for every backend (default: {payloads}, else bf16)", metavar="TYPE"
        ),
        opt.ROUTING.but(
            annotation=str,
            default="uniform",
            help=f"Routing kind: {', '.join(ROUTING_KINDS)}",
            metavar="KIND",
        ),
        opt.SEED.but(annotation=int, default=0, help="Routing seed", metavar="N"),
        opt.SMS.but(
            help=f"Coarse grid of communication SM counts (default {','.join(map(str, COARSE_SMS))})"
        ),
        opt.Flag(
            "backward", bool, False, ("--backward",), "Tune forward+backward tokens/s instead of forward"
        ),
        opt.Flag(
            "schedules",
            str,
            ",".join(SCHEDULES),
            ("--schedules",),
            f"Layer schedules to search, comma-separated: {', '.join(MODES)} (default {','.join(SCHEDULES)})",
            metavar="MODE[,MODE…]",
        ),
        opt.GPUS.but(decls=("--gpus", "--nproc"), help="Ranks on this host (default: every GPU; 2 on CPU)"),
        opt.CPU,
        opt.ITERS.but(help="Timed iterations of the final round (default 50 on GPU, 5 on CPU)"),
        opt.WARMUP.but(help="Warm-up iterations of the final round"),
        opt.REPEAT.but(
            help="Start each job of the final round N times: the winner's margins get their interval over "
            "the starts, 'indistinguishable' where it covers no difference"
        ),
        opt.DB,
        opt.OUT.but(help="Folder for the run directories (default: the data directory)"),
        opt.BACKEND_PATH.but(
            help="NAME=DIR: put DIR first on PYTHONPATH for backend NAME's jobs (e.g. its deep_ep build)"
        ),
        opt.TIMEOUT.but(help="Seconds one backend job of a round may take"),
        opt.Flag(
            "suite_out",
            Path | None,
            None,
            ("--suite-out",),
            "Also write the winner's suite to this file",
            metavar="FILE",
        ),
    )


@user_errors
@opt.command(*_flags(), panels=False)
def tune_command(
    backends: opt.BackendOptions,
    workload: opt.WorkloadOptions,
    launch: opt.LaunchOptions,
    timing: opt.TimingOptions,
    store: opt.StoreOptions,
    preset: str | None,
    intermediate: int | None,
    backward: bool,
    schedules: str,
    suite_out: Path | None,
) -> None:
    """Search backend x SMs x chunk knobs x schedule for the most end-to-end tokens/s of one MoE layer.

    Example: moelab tune --preset deepseek-v3 --backend deepep,hybrid-ep --backend-path deepep=.ext/deepep-v1
    """
    p = model_shape(preset) if preset else None
    paths = backends.paths()
    names = _available(backends, paths)
    grid = tuple(parse_list(workload.sms, int, "sms") or COARSE_SMS)
    modes = _schedules(schedules)
    if any(not isinstance(s, int) or not 1 <= s <= MAX_SMS for s in grid):
        raise SpecError(
            f"--sms takes whole numbers from 1 to {MAX_SMS:,} (the library default is always tried)"
        )
    host = HostFacts(cuda_devices=cuda_devices())
    request = RunRequest(
        backends=names,
        **launch.request_fields(),
        **timing.request_fields(),
        backend_paths=paths,
        health=False,
        command=("moelab", *sys.argv[1:]),
    )
    device, world = plan_world(request, host)
    wl, inter = _layer(workload, intermediate, p, world)
    sm_control = device == "cuda"
    timings = round_timings(device, timing.iters, timing.warmup)
    db_path = resolve_db_path(store.db)
    check_outputs(db_path, {"--suite-out": suite_out})
    plan = plan_trials(
        request=request,
        host=host,
        workload=wl,
        intermediate=inter,
        backward=backward,
        dtypes={} if workload.dtype else default_dtypes(),
        first=coarse(names, grid, sm_control, modes),
        final=timings[2],
        runs_root=store.runs_root(),
        db_path=db_path,
        tune_id=secrets.token_hex(3),
    )
    if suite_out is not None:
        check_output_file(suite_out, "--suite-out")
    check_writable(db_path)
    console.print(
        f"tune {plan.tune_id}: hidden {wl.hidden}, intermediate {inter}, {wl.tokens_per_rank} tokens/rank, topk {wl.topk}, "
        f"{wl.experts_per_rank} experts/rank, {plan.launch.world} {device} ranks; backends {', '.join(names)}"
        + ("" if sm_control else " (CPU ranks: no SM control, searching backends, schedules and knobs)")
    )
    config = TuneConfig(
        backends=names, sms_grid=grid, sm_control=sm_control, timings=timings, schedules=modes
    )
    try:
        result = tune(
            config, lambda n, cands, timing: run_round(plan, n, cands, timing, progress=console.print)
        )
    except TuneInterrupted as stop:
        console.print(str(stop))
        raise interrupted_exit(stop.signal_name) from None
    _print_result(plan, result, suite_out)


def _schedules(text: str) -> tuple[str, ...]:
    """--schedules as modes (moelab.core.e2e_spec.MODES), each once, in the order given."""
    asked = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    bad = [s for s in asked if s not in MODES]
    if bad or not asked:
        raise SpecError(f"--schedules takes {', '.join(MODES)}; got {text!r}")
    return asked


def _available(backends: opt.BackendOptions, paths: dict[str, str]) -> tuple[str, ...]:
    """The backends to tune: those asked (each must run here), else the tunable ones that run here."""
    asked = backends.names()
    names: list[str] = []
    for name in asked or tunable_backends():
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
    return tuple(names)


def _layer(
    workload: opt.WorkloadOptions, intermediate: int | None, p: ModelShape | None, world: int
) -> tuple[Workload, int]:
    """The layer's workload and expert FFN width: the flags, else the preset's, else the defaults."""
    h = workload.hidden if workload.hidden is not None else (p.hidden if p else 8192)
    inter = intermediate if intermediate is not None else (p.intermediate if p else default_intermediate(h))
    k = workload.topk if workload.topk is not None else (p.topk if p else 8)
    epr = (
        workload.experts_per_rank
        if workload.experts_per_rank is not None
        else (p.experts_per_rank(world, "--preset") if p else 8)
    )
    wl = Workload(
        hidden=h,
        tokens_per_rank=workload.tokens_per_rank,
        topk=k,
        experts_per_rank=epr,
        dtype=workload.dtype or "bf16",
        routing=RoutingSpec(kind=workload.routing, seed=workload.seed),
    )
    return wl, inter


def _print_result(plan: TrialPlan, result: TuneResult, suite_out: Path | None) -> None:
    """Every trial, the winner's margins, and the winner as a moelab suite and as framework settings."""
    print_table(
        ["round", "backend", "mode", "sms", "knobs", "tokens/s/rank", "status", "run"],
        [
            (
                t.round,
                t.candidate.backend,
                t.candidate.mode,
                t.candidate.sms if t.candidate.sms is not None else "default",
                ", ".join(f"{a}={b}" for a, b in t.candidate.knobs) or "—",
                t.tokens_per_s,
                t.status,
                t.run_id,
            )
            for t in result.trials
        ],
        title=f"tune {plan.tune_id}: every trial (stored; labels {plan.round_label(1)} …)",
    )
    for line in summary_lines(plan, result):
        console.print(line)
    toml = suite_toml(plan, result.winner)
    console.print("\n# the winner as a moelab suite:", markup=False)
    console.print(toml, markup=False, highlight=False, soft_wrap=True)  # a file: never wrapped
    console.print("# the winner as framework settings:", markup=False)
    for line in framework_settings(plan, result.winner):
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    if suite_out is not None:
        suite_out.write_text(toml)
        console.print(f"suite written to {suite_out}")
