"""Test-only backends that misbehave on one rank, registered through the `moelab.backends` entry point
by the `plugin_path` fixture. They live in the tests and never stand in for a real backend."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch

from moelab.backends.base import Dispatched
from moelab.backends.nccl_a2a import NcclA2ABackend


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
