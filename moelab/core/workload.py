"""The workload spec: one typed object that travels from the CLI to every rank.

Defaults are the reference workload of the design card: HIDDEN=8192, topk=8, 4096 tokens per rank,
2 experts per rank, uniform routing, bf16 payload.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from moelab.core.errors import SpecError

ROUTING_KINDS = ("uniform", "zipf", "hot", "grouped")
MAX_SEED = 2**31 - 1  # routing seeds are stored as INTEGER
PAYLOAD_DTYPES = ("bf16", "fp8", "mxfp8")


@dataclass(frozen=True, kw_only=True, slots=True)
class RoutingSpec:
    """How tokens pick experts. Deterministic in (seed, rank, world)."""

    kind: str = "uniform"
    seed: int = 0
    zipf_s: float = 1.2  # zipf: skew exponent; expert popularity ~ 1 / rank^s
    hot_experts: int = 1  # hot: how many experts are hot
    hot_share: float = 0.5  # hot: share of tokens whose first choice is a hot expert
    # grouped (DeepSeek-V3's group-limited gating, as DeepEP's tests/test_internode.py routes): a group is the
    # experts of `group_ranks` consecutive ranks (8: one 8-GPU node), each token picks its best `topk_groups`
    # groups by their best expert's score (fewer when there are fewer groups), then its topk experts among them
    group_ranks: int = 8
    topk_groups: int = 4

    def check_values(self) -> None:
        """Raise SpecError for a value of the wrong type or out of what the store keeps (the seed is an
        INTEGER column): a user error, refused before anything launches."""
        if not isinstance(self.kind, str):
            raise SpecError(f"routing must be a name ({', '.join(ROUTING_KINDS)}), got {self.kind!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise SpecError(f"seed must be a whole number from 0 to {MAX_SEED}, got {self.seed!r}")
        for name in ("zipf_s", "hot_share"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
                raise SpecError(f"{name} must be a finite number, got {value!r}")
        for name in ("hot_experts", "group_ranks", "topk_groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise SpecError(f"{name} must be a whole number, got {value!r}")

    def validate(self) -> None:
        if self.kind not in ROUTING_KINDS:
            raise SpecError(f"unknown routing {self.kind!r}: choose one of {', '.join(ROUTING_KINDS)}")
        if self.kind == "zipf" and not self.zipf_s > 0:
            raise SpecError(f"zipf skew must be > 0, got {self.zipf_s}")
        if self.kind == "hot":
            if self.hot_experts < 1:
                raise SpecError(f"hot_experts must be >= 1, got {self.hot_experts}")
            if not 0.0 <= self.hot_share <= 1.0:
                raise SpecError(f"hot_share must be within [0, 1], got {self.hot_share}")
        if self.kind == "grouped":
            for name in ("group_ranks", "topk_groups"):
                value = getattr(self, name)
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise SpecError(f"{name} must be a positive integer, got {value!r}")

    def label(self) -> str:
        if self.kind == "zipf":
            return f"zipf{self.zipf_s:g}"
        if self.kind == "hot":
            return f"hot{self.hot_experts}x{self.hot_share:g}"
        if self.kind == "grouped":
            return f"grouped{self.topk_groups}of{self.group_ranks}r"
        return self.kind

    def groups(self, world: int) -> int:
        """grouped: how many expert groups `world` ranks hold."""
        return world // self.group_ranks

    def groups_per_token(self, world: int) -> int:
        """grouped: how many groups each token chooses among (never more than there are)."""
        return min(self.topk_groups, self.groups(world))


LIMITS = {"hidden": 1 << 18, "tokens_per_rank": 1 << 20, "topk": 256, "experts_per_rank": 1 << 12}
# the most SMs a case may ask for or leave free: above any GPU's count (132 on H100, 148 on B200), and inside
# the store's INTEGER column (a larger count was measured as unsupported, then refused when the run was stored)
MAX_SMS = 1024
MAX_TOKEN_BYTES = 16 << 30  # one rank's bf16 tokens; dispatch buffers hold up to world x that


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """One dispatch/combine workload, per rank."""

    hidden: int = 8192
    tokens_per_rank: int = 4096
    topk: int = 8
    experts_per_rank: int = 2
    routing: RoutingSpec = field(default_factory=RoutingSpec)
    dtype: str = "bf16"  # dispatch payload; combine is always bf16

    def num_experts(self, world: int) -> int:
        return self.experts_per_rank * world

    def check_values(self) -> None:
        """Raise SpecError for a value no run could use (a user error, refused before anything launches):
        not a positive integer, or past what a GPU buffer and the store's INTEGER columns can hold."""
        for name in ("hidden", "tokens_per_rank", "topk", "experts_per_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
            if value > LIMITS[name]:
                raise SpecError(
                    f"{name.replace('_', '-')} {value} is above the largest supported, {LIMITS[name]}"
                )
        if not isinstance(self.dtype, str):
            raise SpecError(f"dtype must be a name ({', '.join(PAYLOAD_DTYPES)}), got {self.dtype!r}")
        self.routing.check_values()
        if self.tokens_per_rank * self.hidden * 2 > MAX_TOKEN_BYTES:
            raise SpecError(
                f"tokens-per-rank x hidden x 2 bytes = {self.tokens_per_rank * self.hidden * 2 / 2**30:.0f} GiB per rank "
                f"is above {MAX_TOKEN_BYTES / 2**30:.0f} GiB"
            )

    def validate(self, world: int | None = None) -> None:
        """Raise SpecError with one line when the workload cannot run on `world` ranks."""
        self.check_values()
        if self.dtype not in PAYLOAD_DTYPES:
            raise SpecError(
                f"unknown payload dtype {self.dtype!r}: choose one of {', '.join(PAYLOAD_DTYPES)}"
            )
        self.routing.validate()
        if (
            self.routing.kind == "hot"
            and world is not None
            and self.routing.hot_experts > self.num_experts(world)
        ):
            raise SpecError(
                f"hot_experts {self.routing.hot_experts} > total experts {self.num_experts(world)}"
            )
        if world is not None:
            if world < 1:
                raise SpecError(f"world size must be >= 1, got {world}")
            total = self.num_experts(world)
            if self.topk > total:
                min_epr = -(-self.topk // world)
                min_world = -(-self.topk // self.experts_per_rank)
                raise SpecError(
                    f"topk {self.topk} > total experts {total} ({world} ranks x {self.experts_per_rank} "
                    f"experts/rank): use --experts-per-rank >= {min_epr} or >= {min_world} ranks"
                )
            self._check_groups(world)

    def _check_groups(self, world: int) -> None:
        spec = self.routing
        if spec.kind != "grouped":
            return
        if world % spec.group_ranks:
            raise SpecError(
                f"grouped routing: {world} ranks are not groups of group_ranks {spec.group_ranks}: "
                "use a world size that is a multiple of it, or set group_ranks"
            )
        reachable = spec.groups_per_token(world) * spec.group_ranks * self.experts_per_rank
        if self.topk > reachable:
            raise SpecError(
                f"grouped routing: topk {self.topk} > the {reachable} experts of {spec.groups_per_token(world)} "
                f"group(s) of {spec.group_ranks} ranks x {self.experts_per_rank} experts/rank"
            )

    def bytes_per_token(self) -> int:
        """Bytes of one token's dispatch payload, by the libraries' conventions (docs/design.md)."""
        return payload_bytes_per_token(self.hidden, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        data = dict(data)
        routing = data.pop("routing", {}) or {}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise SpecError(f"unknown workload field(s): {', '.join(sorted(unknown))}")
        rknown = {f.name for f in dataclasses.fields(RoutingSpec)}
        runknown = set(routing) - rknown
        if runknown:
            raise SpecError(f"unknown routing field(s): {', '.join(sorted(runknown))}")
        return cls(routing=RoutingSpec(**routing), **data)

    def label(self) -> str:
        return (
            f"h{self.hidden}-t{self.tokens_per_rank}-k{self.topk}-e{self.experts_per_rank}-"
            f"{self.routing.label()}-s{self.routing.seed}-{self.dtype}"
        )


def payload_bytes_per_token(hidden: int, dtype: str) -> int:
    """bf16: 2 bytes/elem; fp8 (DeepEP): 1 byte/elem + one fp32 scale per 128; mxfp8: 1 byte + one e8m0 per 32."""
    if dtype == "bf16":
        return hidden * 2
    if dtype == "fp8":
        return hidden + (hidden // 128) * 4
    if dtype == "mxfp8":
        return hidden + hidden // 32
    raise SpecError(f"unknown payload dtype {dtype!r}")
