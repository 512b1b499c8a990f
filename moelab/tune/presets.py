"""Layer shapes of public MoE models, for `moelab tune --preset`.

Per layer: hidden size, expert FFN width (the intermediate size of one expert), routed experts and topk,
from each model's published config.json; experts per rank follows from the expert-parallel world
(routed experts / ranks). Shared experts are left out: they are dense compute, not dispatched.
"""

from __future__ import annotations

from dataclasses import dataclass

from moelab.core.errors import SpecError


@dataclass(frozen=True, kw_only=True, slots=True)
class Preset:
    name: str
    hidden: int
    intermediate: int  # one expert's FFN width
    num_experts: int  # routed experts of the layer
    topk: int
    source: str

    def experts_per_rank(self, world: int) -> int:
        if self.num_experts % world:
            raise SpecError(
                f"preset {self.name}: {self.num_experts} experts do not split evenly over {world} ranks; "
                "give --experts-per-rank"
            )
        return self.num_experts // world


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="deepseek-v3", hidden=7168, intermediate=2048, num_experts=256, topk=8,
            source="deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, moe_intermediate_size 2048, n_routed_experts 256, num_experts_per_tok 8",
        ),
        Preset(
            name="mixtral-8x7b", hidden=4096, intermediate=14336, num_experts=8, topk=2,
            source="mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size 4096, intermediate_size 14336, num_local_experts 8, num_experts_per_tok 2",
        ),
        Preset(
            name="qwen3-moe", hidden=4096, intermediate=1536, num_experts=128, topk=8,
            source="Qwen/Qwen3-235B-A22B config.json: hidden_size 4096, moe_intermediate_size 1536, num_experts 128, num_experts_per_tok 8",
        ),
    )
}  # fmt: skip


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise SpecError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
