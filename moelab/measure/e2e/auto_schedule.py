"""`mode = auto`: the schedule the case runs, chosen on the case's own rows before its check.

Every candidate the backend can run (serial, tbo, expert-chunked in 2 and 4 groups, hidden-column
pipelining in 4 slices, each with the case's `comm`) is timed a few calls on this rank, the candidates'
calls interleaved round by round, forward and, with `backward`, forward+backward; every rank takes the
slowest rank's time per candidate, so all agree; the case runs the candidate whose worse speedup over
serial (forward or forward+backward) is the best, and an overlapped one only where that beats serial by
MARGIN. Serial is a candidate, so the layer an auto case runs is never slower than serial by more than
the trials' noise: the overlap is kept only where it pays (issue 37). The trials are stored with the case (`e2e.auto_trials_us`), and its schedule
reads `auto:<chosen>`; the timed ops then measure the chosen schedule against serial as any case does.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from moelab.backends.base import Backend, BackendContext
from moelab.core.e2e_spec import E2ESettings
from moelab.core.workload import Workload
from moelab.measure.e2e.correctness import LayerInputs
from moelab.measure.e2e.layer import output_grad
from moelab.measure.e2e.schedules import schedule_reason

CANDIDATES = (("serial", 1), ("tbo", 2), ("expert", 2), ("expert", 4), ("columns", 4))
TRIALS = 5  # calls per candidate (after one warm-up); their median is the candidate's time
# an overlapped candidate must beat serial by this much (its worse speedup) to be chosen: closer than this
# the trials cannot tell it from serial, and a wrong overlapped pick costs more than a missed one
MARGIN = 0.01


def candidates(
    settings: E2ESettings,
    backend: Backend,
    comm_backend: str,
    experts_per_rank: int,
    hidden: int | None = None,
) -> list[E2ESettings]:
    """The schedules auto may choose among for this backend (serial first), each once."""
    out: list[E2ESettings] = []
    for mode, chunks in CANDIDATES:
        if mode == "expert":
            chunks = min(chunks, experts_per_rank)
        cand = dataclasses.replace(
            settings,
            mode=mode,
            chunks=chunks,
            asked_mode="auto",
            carveout=0 if mode == "serial" else settings.carveout,
        )
        if (
            cand.schedule not in {c.schedule for c in out}
            and schedule_reason(backend, cand, comm_backend, hidden) is None
        ):
            out.append(cand)
    return out


def _time_us(fns: list[Callable[[], object]], cuda: bool) -> list[float]:
    """Each fn's median of TRIALS calls after one warm-up, the calls interleaved round by round (the
    order alternating): candidates timed one after the other drift apart with the clocks and the
    communicator's state (the same serial layer read 0.905-1.070x itself, timed in blocks at EP 4 on
    4 x H200), side by side they don't."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for r in range(TRIALS):
        for k in range(len(fns)) if r % 2 == 0 else reversed(range(len(fns))):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fns[k]()
                end.record()
                end.synchronize()
                times[k].append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter()
                fns[k]()
                times[k].append((time.perf_counter() - t0) * 1e6)
    return [sorted(t)[len(t) // 2] for t in times]


def pick(times_us: list[tuple[float, float | None]]) -> int:
    """The candidate (index; 0 is serial) whose worse speedup over serial, forward or forward+backward, is
    the best and at least 1 + MARGIN; else serial. Ties go to the earlier."""
    serial_f, serial_b = times_us[0]

    def worse_speedup(i: int) -> float:
        f, b = times_us[i]
        ups = [serial_f / f]
        if b is not None and serial_b is not None:
            ups.append(serial_b / b)
        return min(ups)

    best = max(range(len(times_us)), key=worse_speedup)
    return best if worse_speedup(best) >= 1 + MARGIN else 0


def choose_schedule(
    inputs: LayerInputs, backend: Backend, ctx: BackendContext, wl: Workload
) -> tuple[LayerInputs, dict[str, Any]]:
    """`inputs` with the chosen schedule's settings, and the trials for the record."""
    cands = candidates(inputs.settings, backend, ctx.comm_backend, wl.experts_per_rank, wl.hidden)
    cuda = inputs.x.is_cuda
    gout = output_grad(wl.routing.seed, ctx.rank, wl.tokens_per_rank, wl.hidden, inputs.x.device)
    forwards: list[Callable[[], object]] = []
    fwd_bwds: list[Callable[[], object]] = []
    for cand in cands:
        trial = dataclasses.replace(inputs, settings=cand)

        def forward(trial: LayerInputs = trial) -> object:
            with torch.no_grad():
                return trial.forward(inputs.x)

        def fwd_bwd(trial: LayerInputs = trial) -> None:
            inputs.weights.zero_grad()
            with trial.carved():
                trial.forward(inputs.x.detach().requires_grad_(True)).backward(gout)

        forwards.append(forward)
        fwd_bwds.append(fwd_bwd)
    fwd = _time_us(forwards, cuda)
    bwd: list[float | None] = (
        list(_time_us(fwd_bwds, cuda)) if inputs.settings.backward else [None] * len(cands)
    )
    mine = list(zip(fwd, bwd, strict=True))
    inputs.weights.zero_grad()
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(gathered, mine, group=ctx.group)
    slowest = [
        (max(g[i][0] for g in gathered), None if mine[i][1] is None else max(g[i][1] for g in gathered))
        for i in range(len(cands))
    ]
    best = pick(slowest)
    trials = {
        c.schedule: {"fwd": round(f, 1)} | ({"fwd_bwd": round(b, 1)} if b is not None else {})
        for c, (f, b) in zip(cands, slowest, strict=True)
    }
    return dataclasses.replace(inputs, settings=cands[best]), {"auto_trials_us": trials}
