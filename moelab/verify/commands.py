"""The command that runs a library's own benchmark at the configuration of one moelab case.

Each builder takes the library's source tree (--backend-path; the tests sit in TREE/tests and import the
build in TREE) and returns argv, the environment additions and the working directory, never running it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from moelab.core.workload import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class LibraryCommand:
    library: str  # deepep | deepep-ll | hybrid-ep | nccl-tests
    test: str  # the benchmark, as named in the library: tests/test_intranode.py, alltoall_perf
    argv: tuple[str, ...]
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # added to this process's environment
    log_name: str = "library.log"  # file name under RUN_DIR/verify/

    def shell_line(self) -> str:
        """The command as a user would type it (for the log header and the printed plan)."""
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        prefix = f"cd {shlex.quote(self.cwd)} && " if self.cwd else ""
        return f"{prefix}{env + ' ' if env else ''}{cmd}"


DEFAULT_MASTER_PORT = 8361  # the tests' utils.init_dist default


def _python_env(tree: Path, master_port: int) -> dict[str, str]:
    """PYTHONPATH with the library's tree first, as moelab's own job for that backend gets it, and the
    single-node settings the tests' utils.init_dist reads (it takes WORLD_SIZE and RANK as the node count
    and node rank, so values left by a launcher must not leak in; a free port avoids a port still held)."""
    paths = [str(tree)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    return {"PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port), "WORLD_SIZE": "1", "RANK": "0"}  # fmt: skip


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def deepep_intranode(
    tree: Path, wl: Workload, world: int, python: str = sys.executable, master_port: int = DEFAULT_MASTER_PORT
) -> LibraryCommand:
    """DeepEP V1 tests/test_intranode.py: its flags carry the workload; it runs BF16 and FP8 dispatch and
    combine at 24 SMs whatever moelab's dtype (the SM count is fixed in the test)."""
    argv = (python, "test_intranode.py", "--num-processes", str(world), "--num-tokens", str(wl.tokens_per_rank),
            "--hidden", str(wl.hidden), "--num-topk", str(wl.topk), "--num-experts", str(wl.num_experts(world)))  # fmt: skip
    return LibraryCommand(library="deepep", test="tests/test_intranode.py", argv=argv, cwd=str(tree / "tests"),
                          env=_python_env(tree, master_port), log_name="deepep_test_intranode.log")  # fmt: skip


def deepep_low_latency(
    tree: Path, wl: Workload, world: int, python: str = sys.executable, master_port: int = DEFAULT_MASTER_PORT
) -> LibraryCommand:
    """DeepEP V1 tests/test_low_latency.py (no pressure test, NVLink allowed: its defaults)."""
    argv = (python, "test_low_latency.py", "--num-processes", str(world), "--num-tokens", str(wl.tokens_per_rank),
            "--hidden", str(wl.hidden), "--num-topk", str(wl.topk), "--num-experts", str(wl.num_experts(world)))  # fmt: skip
    return LibraryCommand(library="deepep-ll", test="tests/test_low_latency.py", argv=argv, cwd=str(tree / "tests"),
                          env=_python_env(tree, master_port), log_name="deepep_test_low_latency.log")  # fmt: skip


def hybrid_ep(
    tree: Path, wl: Workload, world: int, sms: int | None, python: str = sys.executable,
    master_port: int = DEFAULT_MASTER_PORT,
) -> LibraryCommand:  # fmt: skip
    """Hybrid-EP tests/test_hybrid_ep.py: the workload goes in the environment variables it reads at import
    (HIDDEN_DIM, NUM_TOKENS_PER_RANK, MAX_NUM_OF_TOKENS_PER_RANK, NUM_LOCAL_EXPERTS, TOPK; NUM_SMS_DISPATCH
    and NUM_SMS_COMBINE when moelab's case sets SMs, else the library's default); it runs BF16 then FP8."""
    env = _python_env(tree, master_port) | {
        "HIDDEN_DIM": str(wl.hidden), "NUM_TOKENS_PER_RANK": str(wl.tokens_per_rank),
        "MAX_NUM_OF_TOKENS_PER_RANK": str(wl.tokens_per_rank), "NUM_LOCAL_EXPERTS": str(wl.experts_per_rank),
        "TOPK": str(wl.topk),
    }  # fmt: skip
    if sms is not None:
        env |= {"NUM_SMS_DISPATCH": str(sms), "NUM_SMS_COMBINE": str(sms)}
    argv = (python, "test_hybrid_ep.py", "--num-processes", str(world))
    return LibraryCommand(library="hybrid-ep", test="tests/test_hybrid_ep.py", argv=argv, cwd=str(tree / "tests"),
                          env=env, log_name="hybrid_ep_test_hybrid_ep.log")  # fmt: skip


def alltoall_perf(
    binary: Path, size_bytes: int, world: int, iters: int = 20, warmup: int = 5
) -> LibraryCommand:
    """nccl-tests alltoall_perf at one size, with the iterations moelab's nccl-tests backend uses."""
    from moelab.backends.nccl_tests import alltoall_perf_argv

    argv = alltoall_perf_argv(binary, size_bytes, gpus=world, iters=iters, warmup=warmup)
    return LibraryCommand(library="nccl-tests", test="alltoall_perf", argv=tuple(argv),
                          log_name=f"nccl_tests_alltoall_perf_{size_bytes}.log")  # fmt: skip
