"""The backend protocol: one small class per library, made once per job, used for every case of the job.

A backend receives its rank's tokens and routing and returns what the reference semantics
(moelab.measure.reference) says: the tokens this rank must receive, with local expert ids and weights, and,
in combine, the rows sent back and summed at their source.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from moelab.plan.workload import Workload, payload_bytes_per_token


@dataclass(frozen=True, kw_only=True, slots=True)
class BackendContext:
    """Where a backend runs: this rank, the world, the device and the process group."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    group: Any  # torch.distributed.ProcessGroup; Any keeps this importable without a process group
    gpus_per_node: int
    comm_backend: str  # "nccl" or "gloo"

    @property
    def node(self) -> int:
        return self.rank // self.gpus_per_node

    @property
    def num_nodes(self) -> int:
        return -(-self.world // self.gpus_per_node)


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseConfig:
    """What a backend needs to know about one case."""

    case_id: str
    workload: Workload
    sms: int | None = None  # None: the library's default
    knobs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Dispatched:
    """What dispatch delivered to this rank. Row order is the backend's own."""

    recv_x: torch.Tensor  # [R, H]: bf16, fp8 (with recv_scales) or already dequantized
    recv_topk_idx: torch.Tensor  # [R, K] local expert ids, -1 where the expert lives elsewhere
    recv_topk_weights: torch.Tensor  # [R, K]
    handle: Any  # whatever combine needs
    recv_scales: torch.Tensor | None = None  # fp8: [R, H/128] float32 per-128 scales (DeepEP layout)

    @property
    def num_rows(self) -> int:
        return int(self.recv_x.shape[0])

    def recv_x_float(self) -> torch.Tensor:
        """The received payload as float32, dequantized where it came as fp8 with per-128 scales."""
        x = self.recv_x.float()
        if self.recv_scales is None:
            return x
        rows, hidden = x.shape
        scales = self.recv_scales.float()
        block = hidden // scales.shape[1]
        return (x.view(rows, -1, block) * scales.unsqueeze(-1)).view(rows, hidden)


class Backend(abc.ABC):
    """Subclass, set `name`, and register under the entry-point group `moelab.backends`."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    payload_dtypes: ClassVar[tuple[str, ...]] = ("bf16",)
    sm_control: ClassVar[str | None] = None  # how --sms maps to the library, None when it cannot

    @classmethod
    def availability(cls) -> str | None:
        """None when the backend can run on this host, else the reason in one line. Cheap: no kernels."""
        return None

    def __init__(self, ctx: BackendContext, cases: Sequence[CaseConfig]) -> None:
        """Make buffers and communicators once per job, sized for the largest of `cases`."""
        self.ctx = ctx

    def unsupported_reason(self, case: CaseConfig) -> str | None:
        """Host-side check for configurations the library cannot run (it may trap on the device)."""
        if case.workload.dtype not in self.payload_dtypes:
            return f"{self.name} has no {case.workload.dtype} dispatch payload (has {', '.join(self.payload_dtypes)})"
        if case.sms is not None and self.sm_control is None:
            return f"{self.name} has no SM control here; run it with sms = default"
        return None

    def prepare(self, case: CaseConfig) -> None:  # noqa: B027 - optional hook
        """Apply per-case settings (SM count, knobs) before the case runs."""

    @abc.abstractmethod
    def dispatch(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> Dispatched: ...

    @abc.abstractmethod
    def combine(self, expert_out: torch.Tensor, handle: Any) -> torch.Tensor:
        """expert_out [R, H] bf16, one row per received row, returns [T, H] bf16 summed at the source."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free buffers and communicators."""

    def library_versions(self) -> dict[str, str]:
        """Versions (and commits) of the libraries this backend measured, stored with the run."""
        return {}

    def host_sync_note(self) -> str:
        """Which host synchronisations the timed region contains, stored with the run."""
        return "none"

    def combine_dtype(self, case: CaseConfig) -> str:
        """Payload type of combine (bf16 unless the backend quantizes it)."""
        return "bf16"

    def bytes_per_token(self, case: CaseConfig, op: str) -> int:
        """Bytes of one row's payload in `op` ("dispatch" or "combine"), for byte accounting."""
        if op == "dispatch":
            return case.workload.bytes_per_token()
        return payload_bytes_per_token(case.workload.hidden, self.combine_dtype(case))

    def record(self, case: CaseConfig) -> dict[str, Any]:
        """Knobs and paths this backend actually used for `case` (stored with each number)."""
        return {}
