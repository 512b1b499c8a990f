"""MoE layer shapes of public models, one table for `moelab run --model` and `moelab tune --preset`.

Per layer: hidden size, one routed expert's FFN width (its intermediate size), routed experts and topk,
from each model's published config.json (the address and field names are kept with each entry). The
experts spread over the expert-parallel ranks: experts per rank = experts / ranks, and a rank count that
does not divide the experts is refused. Shared experts are left out: dense compute, never dispatched.
"""

from __future__ import annotations

from dataclasses import dataclass

from moelab.core.errors import SpecError


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    name: str
    hidden: int
    intermediate: int  # one routed expert's FFN width
    num_experts: int  # routed experts of the layer
    topk: int
    source: str  # where the numbers come from

    def experts_per_rank(self, world: int, flag: str = "--model") -> int:
        if self.num_experts % world:
            raise SpecError(
                f"{flag} {self.name}: {self.num_experts} experts do not split evenly over {world} ranks; "
                "give --experts-per-rank, or a rank count that divides them"
            )
        return self.num_experts // world

    def describe(self, world: int) -> str:
        """One line for the run's notes: the shape, how it splits over `world` ranks, and its source."""
        return (
            f"model {self.name}: hidden {self.hidden}, expert intermediate {self.intermediate}, "
            f"{self.num_experts} routed experts ({self.num_experts // world} per rank over {world}), "
            f"topk {self.topk}; source: {self.source}"
        )


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            name="deepseek-v3",
            hidden=7168,
            intermediate=2048,
            num_experts=256,
            topk=8,
            source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (hidden_size, "
            "moe_intermediate_size, n_routed_experts, num_experts_per_tok)",
        ),
        ModelShape(
            name="qwen3-235b-a22b",
            hidden=4096,
            intermediate=1536,
            num_experts=128,
            topk=8,
            source="https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json (hidden_size, "
            "moe_intermediate_size, num_experts, num_experts_per_tok)",
        ),
        ModelShape(
            name="mixtral-8x7b",
            hidden=4096,
            intermediate=14336,
            num_experts=8,
            topk=2,
            source="https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json (hidden_size, "
            "intermediate_size, num_local_experts, num_experts_per_tok)",
        ),
        ModelShape(
            name="gpt-oss-120b",
            hidden=2880,
            intermediate=2880,
            num_experts=128,
            topk=4,
            source="https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json (hidden_size, "
            "intermediate_size, num_local_experts, num_experts_per_tok)",
        ),
        ModelShape(
            name="reference",
            hidden=8192,
            intermediate=2048,
            num_experts=8,
            topk=8,
            source="moelab's reference workload (hidden 8192, topk 8, intermediate hidden/4; 2 experts per "
            "rank on 4 ranks, as the dispatch-combine suite)",
        ),
    )
}
ALIASES = {"qwen3-moe": "qwen3-235b-a22b"}  # tune's earlier name


def model_shape(name: str) -> ModelShape:
    found = MODELS.get(ALIASES.get(name, name))
    if found is None:
        raise SpecError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
    return found
