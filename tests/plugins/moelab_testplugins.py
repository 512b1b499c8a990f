"""Test-only backends, registered through the `moelab.backends` entry point by the `plugin_path` fixture:
ones that misbehave on one rank, and one that brings its library's own benchmark and tune space (verified
and tuned with no edit of moelab). Like any plugin they import only moelab.plugin. They live in the tests
and never stand in for a real backend."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from moelab.plugin import (
    CaseRecord,
    CommandContext,
    Comparison,
    Dispatched,
    Figure,
    HostJob,
    JobFiles,
    JobOutcome,
    LibraryCommand,
    LibraryFigure,
    LibraryFigures,
    LibraryTest,
    NcclA2ABackend,
    OpResult,
    RankRows,
    RunSpec,
    TuneSpace,
    VerifyConfig,
    now_iso,
    summarize,
)


class _OneBadRank(NcclA2ABackend):
    bad_rank = 1

    def misbehave(self) -> None:
        raise NotImplementedError

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        if self.ctx.rank == self.bad_rank:
            self.misbehave()
        return super().dispatch(x, topk_idx, topk_weights, layout=layout)

    def combine(self, expert_out: torch.Tensor, handle: Any) -> torch.Tensor:
        return super().combine(expert_out, handle)


class SegfaultBackend(_OneBadRank):
    name = "test-segv"

    def misbehave(self) -> None:
        os.kill(os.getpid(), signal.SIGSEGV)


class RaiseBackend(_OneBadRank):
    name = "test-raise"

    def misbehave(self) -> None:
        raise RuntimeError("test-raise: deliberate failure on one rank")


class HangBackend(_OneBadRank):
    """One rank never joins the collective: the others time out in it."""

    name = "test-hang"

    def misbehave(self) -> None:
        time.sleep(3600)


class HangAllBackend(_OneBadRank):
    """Every rank hangs outside any collective: only the launcher's wall-clock timeout ends it."""

    name = "test-hang-all"

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Dispatched:
        time.sleep(3600)
        raise AssertionError("unreachable")


class CtorRaiseBackend(NcclA2ABackend):
    """Every rank raises while the backend is built (a bad knob, a library that refuses the GPU)."""

    name = "test-ctor-raise"

    def __init__(self, ctx: Any, cases: Any) -> None:
        raise ValueError(f"test-ctor-raise: refusing to build on rank {ctx.rank}")


class AbortBackend(_OneBadRank):
    """One rank aborts (SIGABRT, as a failed C++ assertion in a library does)."""

    name = "test-abort"

    def misbehave(self) -> None:
        os.abort()


class JitBackend(NcclA2ABackend):
    """nccl-a2a that 'compiles' on the first call of each case (a sleep), as Hybrid-EP's JIT does."""

    name = "test-jit"
    compiles_on_first_call = True
    COMPILE_S = 0.4

    def prepare(self, case: Any) -> None:
        super().prepare(case)
        self._compiled = False

    def dispatch(
        self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, layout: Any = None
    ) -> Any:
        if not self._compiled:
            time.sleep(self.COMPILE_S)
            self._compiled = True
        return super().dispatch(x, topk_idx, topk_weights, layout=layout)


class SpawnerBackend(NcclA2ABackend):
    """nccl-a2a that starts a helper process in a session of its own on every rank and never stops it (as
    a library's proxy or daemon can); the job itself succeeds. It prints the helper's pid in the rank log."""

    name = "test-spawner"

    def __init__(self, ctx: Any, cases: Any) -> None:
        import subprocess
        import sys

        super().__init__(ctx, cases)
        helper = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
        print(f"spawned helper pid {helper.pid}", flush=True)


class StopBackend(_OneBadRank):
    """One rank stops itself (SIGSTOP, as a debugger or a job-control signal can): its peers time out."""

    name = "test-stop"

    def misbehave(self) -> None:
        os.kill(os.getpid(), signal.SIGSTOP)


class ExitZeroBackend(_OneBadRank):
    """One rank exits 0 in the middle of dispatch, leaving no record: its peers time out waiting for it."""

    name = "test-exit0"

    def misbehave(self) -> None:
        os._exit(0)


# --- a plugin library that brings its own benchmark and tune space ----------------------------------------

LIB_FIGURE = "test_lib_rank0_bytes_over_mean_time"
_BENCH_LINE = re.compile(r"^<dispatch/(\w+)> ([\d.]+) GB/s in ([\d.]+) us$")


class OwnBench(LibraryTest):
    """The plugin library's own benchmark, bench.py in its source tree (--backend-path test-lib=DIR): its
    dispatch line per payload against moelab's figure computed its way (LIB_FIGURE)."""

    test = "bench.py"

    def comparisons(self, config: VerifyConfig) -> list[Comparison]:
        return [
            Comparison(op="dispatch", library_dtype=d, moelab_dtype=d, figure=LIB_FIGURE)
            for d in config.dtypes
        ]

    def commands(self, ctx: CommandContext) -> dict[str, LibraryCommand]:
        assert ctx.tree is not None
        c, world = ctx.config, ctx.spec.launch.world
        argv = (
            sys.executable,
            "bench.py",
            "--ranks",
            str(world),
            "--tokens",
            str(c.tokens_per_rank),
            "--hidden",
            str(c.hidden),
            "--topk",
            str(c.topk),
            "--experts",
            str(c.experts_per_rank * world),
            "--dtypes",
            ",".join(c.dtypes),
        )
        return {
            "*": LibraryCommand(
                library=ctx.backend,
                test=self.test,
                argv=argv,
                cwd=str(ctx.tree),
                log_name="test_lib_bench.log",
            )
        }

    def figures(self, text: str, dtype: str) -> list[LibraryFigure]:
        out = []
        for line in text.splitlines():
            if m := _BENCH_LINE.match(line.strip()):
                out.append(
                    LibraryFigure(
                        library="test-lib",
                        op="dispatch",
                        dtype=m[1],
                        label=line.strip(),
                        gbps=float(m[2]),
                        time_us=float(m[3]),
                        line=line,
                    )
                )
        return out


class ExchangeTuning(TuneSpace):
    """Tries each exchange of the nccl-a2a it is built on; names the setting as its library would."""

    def knob_variants(self, sms: int | None) -> list[dict[str, Any]]:
        return [{"exchange": "splits"}, {"exchange": "allgather"}]

    def settings(self, sms: int | None, knobs: Mapping[str, Any], workload: Any) -> list[str]:
        return [f"test-lib: TestLib(exchange={knobs.get('exchange', 'auto')!r}, sms={sms})"]


class LibraryTestedBackend(NcclA2ABackend, LibraryFigures):
    """nccl-a2a as a library of its own: verified against bench.py, tuned over its exchanges, with its own
    figure (rank 0's received bytes over rank 0's mean time of dispatch, timed back to back)."""

    name = "test-lib"
    library_ops = ("dispatch",)
    library_test = OwnBench()
    tuning = ExchangeTuning()

    @classmethod
    def library_figures(
        cls, op: str, rows: Sequence[RankRows], bytes_per_row: int, samples_us: Sequence[Sequence[float]]
    ) -> list[Figure]:
        if op not in cls.library_ops or not rows:
            return []
        rank0 = float(rows[0].recv_rows * bytes_per_row)
        mean_us = sum(samples_us[0]) / len(samples_us[0])
        text = "test-lib's own figure: rank 0's received bytes over rank 0's mean back-to-back dispatch time"
        return [
            Figure(
                definition=LIB_FIGURE,
                bytes_mean=rank0,
                bytes_max=rank0,
                gbps=rank0 / mean_us / 1e3,
                text=text,
            )
        ]


class ToolHostJob(HostJob):
    """A host job as an external tool's would be: the launching host runs the whole job (here it writes each
    case's one figure itself, TIME_US per call, as a tool would print it), no moelab ranks."""

    name = "test-host"
    TIME_US = 100.0

    @classmethod
    def run_job(cls, spec: RunSpec, files: JobFiles) -> JobOutcome:
        started, t = now_iso(), cls.TIME_US
        where = {"world": spec.launch.world, "gpus_per_node": spec.launch.gpus_per_node}
        summary = summarize([[t]])  # one figure: every quantile is it
        op = OpResult(op="alltoall", samples_us=((t,),), bytes_per_row=0, summary=summary, figures=())
        for case in spec.cases_for(cls.name):
            record = CaseRecord(case=case, status="ok", ops=(op,), **where)
            files.append_result(
                CaseRecord.skipped(case, case.skip_reason, **where) if case.skip_reason else record
            )
        outcome = JobOutcome(
            backend=cls.name,
            argv=[cls.name],
            returncode=0,
            signal=None,
            timed_out=False,
            duration_s=0.0,
            started_at=started,
        )
        files.write_job(outcome.to_dict())
        return outcome
