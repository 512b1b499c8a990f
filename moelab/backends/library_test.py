"""A library's own benchmark as `moelab verify` runs it beside moelab's measurement: how its command is built
for a configuration, how its printout is parsed, and which moelab figure each printed figure must equal.

A backend declares one as its class attribute `library_test` (a plugin too): verify reads everything it
knows about a library from there, so a backend with a library test is verified with no edit of verify.
"""

from __future__ import annotations

import abc
import shlex
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from moelab.core.library_figures import LibraryFigure
from moelab.core.spec import RunSpec
from moelab.core.workload import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class LibraryCommand:
    library: str  # the backend whose library this is
    test: str  # the benchmark, as named in the library: tests/test_intranode.py, alltoall_perf
    argv: tuple[str, ...]
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # added to this process's environment
    log_name: str = "library.log"  # file name under RUN_DIR/verify/

    def shell_line(self) -> str:
        """The command as a user would type it (for the log header and the printed plan)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cmd = " ".join(shlex.quote(a) for a in self.argv)
        prefix = f"cd {shlex.quote(self.cwd)} && " if self.cwd else ""
        return f"{prefix}{env + ' ' if env else ''}{cmd}"


DEFAULT_MASTER_PORT = (
    8361  # the DeepEP family's tests' utils.init_dist default; the port a printed plan shows
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyConfig:
    """The configuration `moelab verify` asks every library's test to run (one whole number per size)."""

    hidden: int
    tokens_per_rank: int
    topk: int
    experts_per_rank: int
    dtypes: tuple[str, ...]
    sms: int | None  # None: each library test's own SM count

    def workload(self) -> Workload:
        return Workload(
            hidden=self.hidden,
            tokens_per_rank=self.tokens_per_rank,
            topk=self.topk,
            experts_per_rank=self.experts_per_rank,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    """A figure the library's test prints for a configuration, and the moelab figure it must equal."""

    op: str
    library_dtype: str  # the dtype the parser gives the library's line
    moelab_dtype: str  # the payload of the moelab case it is compared with
    figure: str  # the moelab definition
    timing: str = "api"
    # how moelab's side is read: "stored": moelab's stored `figure` of `op`; "library_bytes": the library's
    # bytes (its GB/s x its time) over moelab's time, the kernel-only time (timing "kernel") of the first of
    # `time_ops` the case stored (else of `op`), or rank 0's mean time of the first of `time_ops` (a figure
    # moelab does not store itself)
    moelab_side: str = "stored"
    time_ops: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandContext:
    """What a library test's command is built from."""

    backend: str
    config: VerifyConfig
    spec: RunSpec  # moelab's side as planned: the world, the cases, the launch settings (tool paths)
    tree: Path | None  # the library's source tree (--backend-path), for a test that lives in it
    master_port: int


class LibraryTest(abc.ABC):
    """Subclass per benchmark; the backend class holds an instance as `library_test`."""

    test: ClassVar[str]  # as the library names it: tests/test_intranode.py, alltoall_perf
    in_tree: ClassVar[bool] = True  # at TREE/<test> of the tree given with --backend-path NAME=TREE
    tree_from: ClassVar[str | None] = (
        None  # a backend whose --backend-path serves when this one's is not given
    )
    by_default: ClassVar[bool] = True  # verified when --backend is not given
    only_dtypes: ClassVar[
        tuple[str, ...]
    ] = ()  # the payloads it prints whatever is asked (empty: those asked)
    sms_note: ClassVar[str] = ""  # how its SM count is set, for `moelab verify --help`
    kernel_figures: ClassVar[bool] = (
        False  # some of its figures are kernel-only (moelab's need --trace torch)
    )
    case_knobs: ClassVar[Mapping[str, Any]] = {}  # knobs that make moelab's op time what the test times
    definitions: ClassVar[Mapping[str, str]] = {}  # the figures verify derives for it, defined

    def refuse(self, config: VerifyConfig) -> str | None:
        """Why verify must refuse `config` for this test (a user error, exit 2), or None."""
        return None

    def case_sms(self, config: VerifyConfig) -> int | None:
        """The SM count of moelab's case: the one the test runs (None: the library's default)."""
        return None

    def case_dtypes(self, config: VerifyConfig) -> tuple[str, ...]:
        """The payloads of moelab's cases: those the test prints figures for."""
        return self.only_dtypes or config.dtypes

    def unsupported_reason(self, config: VerifyConfig, world: int, gpus_per_node: int) -> str | None:
        """Why the test cannot run this configuration (it would trap or assert), or None."""
        return None

    @abc.abstractmethod
    def comparisons(self, config: VerifyConfig) -> list[Comparison]:
        """The figures the test prints for `config`, each with the moelab figure it must equal."""

    @abc.abstractmethod
    def commands(self, ctx: CommandContext) -> dict[str, LibraryCommand]:
        """The command(s), keyed by the moelab payload whose figures they print ('*': all of them)."""

    @abc.abstractmethod
    def figures(self, text: str, dtype: str) -> list[LibraryFigure]:
        """The figures in the test's printout (`dtype`: the payload its command ran)."""

    def matches(self, figure: LibraryFigure, comparison: Comparison) -> bool:
        """Whether a parsed figure is the one `comparison` takes."""
        return (
            figure.op == comparison.op
            and figure.dtype == comparison.library_dtype
            and figure.timing == comparison.timing
        )

    def failure_note(self, text: str, comparison: Comparison) -> str | None:
        """What the test's printout says about a mismatch (e.g. a host-bound figure), or None."""
        return None
