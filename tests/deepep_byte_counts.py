"""DeepEP's own tests' byte counting, written out as those tests do it: the oracle moelab's definitions
(moelab.core.definitions) are held to. Test code: moelab itself derives the same figures from its own rows."""

from __future__ import annotations

import torch

from moelab.backends.deepep_common import LibraryFigure


def deepep_nvl_figure(recv_rows: int, hidden: int, dtype: str, time_us: float) -> LibraryFigure:
    """DeepEP tests/test_intranode.py: `recv_x.numel() * 2` (bf16 bytes of the rows this rank received, its own
    included), times `(1 + 4/128) / 2` for fp8, over the rank's average time; printed by local rank 0."""
    nbytes = recv_rows * hidden * 2 * ((1 + 4 / 128) / 2 if dtype == "fp8" else 1.0)
    return LibraryFigure(
        definition="deepep_nvl", gbps=nbytes / 1e9 / (time_us * 1e-6), time_us=time_us, bytes=nbytes
    )


def deepep_rdma_pairs(is_token_in_rank: torch.Tensor, gpus_per_node: int) -> int:
    """DeepEP tests/test_internode.py RDMA bytes count: unique (token, destination node) pairs, own node included."""
    tokens, world = is_token_in_rank.shape
    nodes = -(-world // gpus_per_node)
    padded = torch.zeros(tokens, nodes * gpus_per_node, dtype=torch.bool)
    padded[:, :world] = is_token_in_rank.bool().cpu()
    return int(padded.view(tokens, nodes, gpus_per_node).any(dim=2).sum())
