"""The GPU-only parts of the overlapped schedules, on one CUDA device: the partition's green contexts, the
padded batched-matmul GEMM against the grouped kernel, the GEMM choice and the kernels recorded, and the
zero-SM path's reason on this torch/NCCL. Skipped cleanly without CUDA."""

from __future__ import annotations

import pytest
import torch

from moelab.backends.nccl_a2a import nccl_cta_policy_reason
from moelab.measure.e2e.gemm_choice import gemm_kernels
from moelab.measure.e2e.layer import ExpertWeights, swiglu_ffn
from moelab.measure.e2e.overlap import GREEN_SM_STEP, Streams, green_contexts_available
from moelab.measure.e2e.permute import PairMap, pair_map, permute

pytestmark = pytest.mark.gpu


def _cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device("cuda", 0)


def _hopper_grouped() -> torch.device:
    device = _cuda()
    if not hasattr(torch, "_grouped_mm") or torch.cuda.get_device_capability(device) < (9, 0):
        pytest.skip("needs torch._grouped_mm on SM90+")
    return device


def _grouped_case(
    g: torch.Generator, idx: torch.Tensor, experts: int, hidden: int, inter: int
) -> tuple[PairMap, torch.Tensor, torch.Tensor, ExpertWeights]:
    """The routing `idx` [rows, topk] grouped by expert, random rows and expert weights drawn from `g`."""
    device, (rows, topk) = idx.device, idx.shape
    m, offsets = pair_map(idx, torch.rand(rows, topk, generator=g, device=device), experts)
    x = permute(torch.randn(rows, hidden, generator=g, device=device, dtype=torch.bfloat16), m, "torch")
    w = ExpertWeights(
        w13=torch.randn(experts, hidden, 2 * inter, generator=g, device=device, dtype=torch.bfloat16)
        / hidden**0.5,
        w2=torch.randn(experts, inter, hidden, generator=g, device=device, dtype=torch.bfloat16) / inter**0.5,
        first_expert=0,
    )
    return m, offsets, x, w


def test_partition_streams_hold_their_sms_or_say_why_not() -> None:
    device = _cuda()
    total = torch.cuda.get_device_properties(device).multi_processor_count
    s = Streams(device, comm_sms=24)
    if not s.partitioned:
        assert s.partition_note, "no green contexts and no reason"
        return
    assert green_contexts_available() and s.gemm_sms is not None
    assert s.gemm_sms % GREEN_SM_STEP == 0 and s.gemm_sms <= total - 24
    a = torch.randn(2048, 2048, device=device, dtype=torch.bfloat16)
    with torch.cuda.stream(s.compute):  # a GEMM on the compute partition gives the same result
        got = a @ a
    torch.cuda.synchronize()
    torch.testing.assert_close(got, a @ a)


def test_padded_equals_grouped_on_cuda_and_kernels_are_named() -> None:
    device = _hopper_grouped()
    g = torch.Generator(device=device).manual_seed(0)
    experts, rows, topk, hidden, inter = 16, 1024, 4, 512, 256
    idx = torch.randint(0, experts, (rows, topk), generator=g, device=device)
    m, offsets, x, w = _grouped_case(g, idx, experts, hidden, inter)
    grouped = swiglu_ffn(x, offsets, w, "grouped", max_group=m.max_group)
    padded = swiglu_ffn(x, offsets, w, "padded", max_group=m.max_group)
    torch.testing.assert_close(padded.float(), grouped.float(), rtol=2e-2, atol=2e-2)
    assert gemm_kernels(lambda: swiglu_ffn(x, offsets, w, "padded", max_group=m.max_group))


def test_zero_sm_reason_names_what_is_missing_or_none() -> None:
    _cuda()
    reason = nccl_cta_policy_reason()
    assert reason is None or "cta_policy" in reason or "CTAPolicy" in reason or "NCCL" in reason


@pytest.mark.parametrize("rows", [1024, 1031])
def test_grouped_wide_runs_the_wide_tile_where_torch_would_take_the_narrow_one(rows: int) -> None:
    """A micro-batch of the DeepSeek-V3 shape at EP = 2 averages 128 rows per expert: torch._grouped_mm
    takes its 64x128x128 ping-pong tile there; grouped-wide's tail rows move it to the 128x256x64
    cooperative one, with the same outputs. 1031 rows (4124 pairs over 32 experts) still average 128 in
    torch's integer division: the 2 x H100 run of round 8 recorded the ping-pong tile for grouped-wide on
    such a micro-batch, before wide_tile_pad divided as torch does."""
    device = _hopper_grouped()
    g = torch.Generator(device=device).manual_seed(0)
    experts, topk, hidden, inter = 32, 4, 512, 256
    idx = torch.argsort(torch.rand(rows, experts, generator=g, device=device), dim=1)[:, :topk]
    m, offsets, x, w = _grouped_case(g, idx, experts, hidden, inter)
    assert m.num_pairs // experts == 128
    narrow = gemm_kernels(lambda: swiglu_ffn(x, offsets, w, "grouped"))
    wide = gemm_kernels(lambda: swiglu_ffn(x, offsets, w, "grouped-wide"))
    assert narrow[0].startswith("64x128x128 ping-pong"), narrow
    assert wide[0].startswith("128x256x64 cooperative"), wide
    torch.testing.assert_close(
        swiglu_ffn(x, offsets, w, "grouped-wide"), swiglu_ffn(x, offsets, w, "grouped")
    )
