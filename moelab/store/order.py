"""One order for cases and ops everywhere they are listed: workload fields, then SM counts as numbers (8
before 16, the library default first), then ops in pipeline order. Case ids alone sort as text (sm16 <
sm8)."""

from __future__ import annotations

from moelab.core.ops import OPS


def case_order(alias: str = "") -> str:
    """SQL ORDER BY terms over the cases table (give its alias when joined)."""
    a = f"{alias}." if alias else ""
    return (
        ", ".join(
            f"{a}{c}"
            for c in ("backend", "hidden", "tokens_per_rank", "topk", "experts_per_rank", "routing", "dtype")
        )
        + f", {a}sms NULLS FIRST, {a}case_id"
    )


def op_order(column: str = "op") -> str:
    names = ", ".join(f"'{name}'" for name in OPS)
    return f"coalesce(list_position([{names}], {column}), 99), {column}"
