"""moelab's Triton grouped GEMM (moelab.measure.e2e.grouped_gemm): on the CPU through triton's interpreter
(float16 and float32: its bfloat16 dot is wrong), on CUDA in bfloat16 against torch._grouped_mm (marked
gpu); and `gemm = triton` refused with its reason where it cannot run."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moelab.core.errors import SpecError
from moelab.measure.e2e import grouped_gemm
from moelab.measure.e2e.carveout import gemm_carveout, held_sms
from moelab.measure.e2e.grouped_gemm import (
    INTERPRETED_SMS,
    TileConfig,
    launch,
    programs,
    triton_grouped_mm,
    triton_grouped_swiglu,
    unavailable_reason,
)
from moelab.measure.e2e.layer import ExpertWeights, grouped_matmul, resolve_gemm, swiglu_ffn

pytest.importorskip("triton")
INTERP_M = 32  # the interpreter's BLOCK_M (grouped_gemm.INTERPRETED_BLOCKS): tails of <= 16 rows go half


def _cpu_interpreted() -> None:
    if torch.cuda.is_available():
        pytest.skip("the interpreter runs in the CPU session (conftest sets TRITON_INTERPRET=1 there)")


def _reference(x: torch.Tensor, w: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    outs, start = [], 0
    for e, n in enumerate(sizes):
        outs.append(x[start : start + n].double() @ w[e].double())
        start += n
    return torch.cat(outs)


def _ends(sizes: list[int]) -> torch.Tensor:
    return torch.tensor(sizes).cumsum(0).to(torch.int32)


@settings(max_examples=12, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=80), min_size=1, max_size=5),
    k=st.sampled_from([16, 40, 48]),
    n=st.sampled_from([8, 40, 64]),
    transposed=st.booleans(),
)
def test_matches_per_group_matmul_on_any_group_sizes(
    sizes: list[int], k: int, n: int, transposed: bool
) -> None:
    """Empty groups, groups ending in a full, a half-height or a one-row tile, a reduction and columns off
    the tile (zero-filled past the weights' edge, never the next expert's), weights read transposed."""
    _cpu_interpreted()
    g = torch.Generator().manual_seed(sum(sizes) + k + n)
    x = torch.randn(sum(sizes), k, generator=g)
    if transposed:  # w as a view of [E, N, K]: the input-gradient GEMM's weights
        w = torch.randn(len(sizes), n, k, generator=g).transpose(1, 2)
    else:
        w = torch.randn(len(sizes), k, n, generator=g)
    got = triton_grouped_mm(x, w, _ends(sizes), max(sizes))
    assert got.shape == (sum(sizes), n)
    if sum(sizes):
        torch.testing.assert_close(got.double(), _reference(x, w, sizes), rtol=1e-4, atol=1e-4)


def test_tiles_of_every_height_give_the_same_bits() -> None:
    """A group's rows come out the same whether they fell in a full tile or a half-height last tile: every
    tile sums its products in the same order."""
    _cpu_interpreted()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1, 48, 40, generator=g).half()
    x = torch.randn(INTERP_M + INTERP_M // 2 + 1, 48, generator=g).half()
    tail = INTERP_M // 2
    half = triton_grouped_mm(x[:tail], w, _ends([tail]), tail)  # tail rows: a half-height tile
    full = triton_grouped_mm(x[: tail + 1], w, _ends([tail + 1]), tail + 1)  # one more: a full tile
    assert torch.equal(half, full[:tail])


def test_backward_gives_both_gradients() -> None:
    _cpu_interpreted()
    g = torch.Generator().manual_seed(1)
    sizes = [7, 0, 33, 20]
    x = torch.randn(sum(sizes), 16, generator=g, requires_grad=True)
    w = torch.randn(4, 16, 24, generator=g, requires_grad=True)
    gy = torch.randn(sum(sizes), 24, generator=g)
    triton_grouped_mm(x, w, _ends(sizes), max(sizes)).backward(gy)
    xr, wr = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    _reference(xr, wr, sizes).backward(gy.double())
    assert x.grad is not None and w.grad is not None and xr.grad is not None and wr.grad is not None
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad.double(), wr.grad, rtol=1e-4, atol=1e-4)


@settings(max_examples=50, deadline=None)
@given(
    tiles=st.integers(min_value=1, max_value=5000),
    sms=st.integers(min_value=1, max_value=200),
    held=st.integers(min_value=-1, max_value=220),
)
def test_programs_leave_the_carved_out_sms_free(tiles: int, sms: int, held: int) -> None:
    """One program per tile without a carve-out; with one, never more programs than the SMs left (at least
    one program, never more than the tiles)."""
    got = programs(tiles, sms, held)
    if held <= 0:
        assert got == tiles
    else:
        assert 1 <= got <= tiles
        assert got <= max(1, sms - held)
        assert got == min(tiles, sms - held) or sms - held < 1


class _GridSpy:
    """Stands in for the kernel object: records each launch's grid, then launches the real kernel."""

    def __init__(self, kernel: object) -> None:
        self.kernel, self.grids = kernel, []  # type: list[tuple[int, ...]]

    def __getitem__(self, grid: object) -> object:
        def record(meta: dict[str, object]) -> tuple[int, ...]:
            got = tuple(grid(meta) if callable(grid) else grid)  # type: ignore[arg-type]
            self.grids.append(got)
            return got

        return self.kernel[record]  # type: ignore[index]


@pytest.fixture(params=[1, 2])
def carved_out(request: pytest.FixtureRequest) -> object:
    """A GEMM carve-out that leaves the interpreter's stand-in GPU 1 or 2 SMs, restored after."""
    previous = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(INTERPRETED_SMS - request.param)
    yield request.param
    torch._C._set_sm_carveout_experimental(previous)


def test_under_a_carve_out_the_kernel_runs_persistent_with_the_same_bits(
    carved_out: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a carve-out the launch has one program per SM left (one or two of the interpreter's 4 SMs),
    taking tiles from a counter until none is left, and gives the bits of the one-program-per-tile launch:
    the GEMM, its input gradient and the fused SwiGLU. Before, the Triton GEMM ignored the carve-out and
    filled every SM."""
    _cpu_interpreted()
    assert held_sms() == INTERPRETED_SMS - carved_out
    spy = _GridSpy(grouped_gemm._jit().triton_grouped_gemm)
    monkeypatch.setattr(grouped_gemm._jit(), "triton_grouped_gemm", spy)
    g = torch.Generator().manual_seed(7)
    sizes = [40, 0, 17, 33]
    x = torch.randn(sum(sizes), 32, generator=g).half().requires_grad_(True)
    w = torch.randn(4, 32, 48, generator=g).half().requires_grad_(True)
    w13 = torch.randn(4, 32, 32, generator=g).half()
    gy = torch.randn(sum(sizes), 48, generator=g).half()
    carved = triton_grouped_mm(x, w, _ends(sizes), max(sizes))
    carved.backward(gy)
    carved_grad, x.grad = x.grad, None
    carved_swiglu = triton_grouped_swiglu(x.detach(), w13, _ends(sizes), max(sizes))
    assert spy.grids and all(grid == (carved_out,) for grid in spy.grids)  # forward, input gradient, SwiGLU
    launches = len(spy.grids)
    torch._C._set_sm_carveout_experimental(None)
    whole = triton_grouped_mm(x, w, _ends(sizes), max(sizes))
    whole.backward(gy)
    assert all(grid[0] > 1 for grid in spy.grids[launches:])  # one program per tile again
    assert torch.equal(carved, whole)
    assert carved_grad is not None and x.grad is not None and torch.equal(carved_grad, x.grad)
    assert torch.equal(carved_swiglu, triton_grouped_swiglu(x.detach(), w13, _ends(sizes), max(sizes)))


def test_a_fixed_tile_config_is_launched_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """`launch(config=...)` (what benchmarks/triton_gemm_tiles.py sweeps) runs those blocks, not the
    default ones: a different grid, the same result (to an ulp: the interpreter's numpy matmul may sum a
    16-row block in another order than a 32-row one)."""
    _cpu_interpreted()
    spy = _GridSpy(grouped_gemm._jit().triton_grouped_gemm)
    monkeypatch.setattr(grouped_gemm._jit(), "triton_grouped_gemm", spy)
    g = torch.Generator().manual_seed(3)
    sizes = [40, 0, 17, 33]
    x = torch.randn(sum(sizes), 32, generator=g).half()
    w = torch.randn(4, 32, 48, generator=g).half()
    w13 = torch.randn(4, 32, 32, generator=g).half()
    ends = _ends(sizes)
    default = launch(x, w, ends, max(sizes))[0]
    default_act = launch(x, w13, ends, max(sizes), swiglu=True)[0]
    small = TileConfig((16, 16, 16), warps=1, stages=1, half_tail=False)
    fixed = launch(x, w, ends, max(sizes), config=small)[0]
    fixed_act = launch(x, w13, ends, max(sizes), swiglu=True, config=small)[0]
    # 4 experts x (48 / 32 or 16 / 16 column tiles) x (40 / 32 or 40 / 16 row tiles)
    assert [grid[0] for grid in spy.grids] == [4 * 2 * 2, 4 * 1 * 2, 4 * 3 * 3, 4 * 1 * 3]
    torch.testing.assert_close(fixed, default, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(fixed_act, default_act, rtol=2e-3, atol=2e-3)


def _swiglu_reference(x: torch.Tensor, w13: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    h = _reference(x, w13, sizes)
    inter = w13.shape[2] // 2
    return torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]


@settings(max_examples=10, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=70), min_size=1, max_size=4),
    inter=st.sampled_from([8, 16, 24, 40]),
)
def test_fused_swiglu_matches_the_gemm_then_the_activation(sizes: list[int], inter: int) -> None:
    """The first GEMM with the activation in its epilogue: gate columns n0.. and up columns I + n0.. of
    one tile, an intermediate size off the tile (its columns past I masked), forward and both gradients."""
    _cpu_interpreted()
    g = torch.Generator().manual_seed(sum(sizes) + inter)
    x = torch.randn(sum(sizes), 32, generator=g, requires_grad=True)
    w13 = torch.randn(len(sizes), 32, 2 * inter, generator=g, requires_grad=True)
    got = triton_grouped_swiglu(x, w13, _ends(sizes), max(sizes))
    assert got.shape == (sum(sizes), inter)
    if not sum(sizes):
        return
    xr, wr = x.detach().double().requires_grad_(True), w13.detach().double().requires_grad_(True)
    want = _swiglu_reference(xr, wr, sizes)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    ga = torch.randn(got.shape, generator=g)
    got.backward(ga)
    want.backward(ga.double())
    assert x.grad is not None and w13.grad is not None and xr.grad is not None and wr.grad is not None
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(w13.grad.double(), wr.grad, rtol=1e-3, atol=1e-3)


def test_fused_swiglu_without_grad_writes_no_h() -> None:
    """Forward only (no_grad): the kernel is launched without h, and the activation is the same."""
    _cpu_interpreted()
    g = torch.Generator().manual_seed(5)
    sizes = [20, 3]
    x, w13 = torch.randn(23, 32, generator=g), torch.randn(2, 32, 32, generator=g)
    with torch.no_grad():
        got = triton_grouped_swiglu(x, w13, _ends(sizes), 20)
    torch.testing.assert_close(got.double(), _swiglu_reference(x, w13, sizes), rtol=1e-4, atol=1e-4)


def test_ffn_with_triton_is_the_unfused_ffn() -> None:
    """swiglu_ffn's triton path (the activation fused, then the second GEMM) against the same GEMMs with
    torch's activation between them, and the grouped weight gradients."""
    _cpu_interpreted()
    g = torch.Generator().manual_seed(6)
    sizes = [40, 0, 17, 9]
    weights = ExpertWeights(
        w13=torch.randn(4, 32, 48, generator=g).requires_grad_(True),
        w2=torch.randn(4, 24, 32, generator=g).requires_grad_(True),
        first_expert=0,
    )
    x = torch.randn(sum(sizes), 32, generator=g, requires_grad=True)
    y = swiglu_ffn(x, _ends(sizes), weights, "triton", max_group=40)
    xr = x.detach().double().requires_grad_(True)
    w13, w2 = (
        weights.w13.detach().double().requires_grad_(True),
        weights.w2.detach().double().requires_grad_(True),
    )
    want = _reference(_swiglu_reference(xr, w13, sizes), w2, sizes)
    torch.testing.assert_close(y.double(), want, rtol=1e-3, atol=1e-3)
    gy = torch.randn(y.shape, generator=g)
    y.backward(gy)
    want.backward(gy.double())
    for got_grad, want_grad in ((x.grad, xr.grad), (weights.w13.grad, w13.grad), (weights.w2.grad, w2.grad)):
        assert got_grad is not None and want_grad is not None
        torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-3, atol=1e-3)


def test_grouped_matmul_reads_the_largest_group_where_not_given() -> None:
    _cpu_interpreted()
    g = torch.Generator().manual_seed(2)
    sizes = [3, 45, 0, 9]
    x, w = torch.randn(sum(sizes), 16, generator=g), torch.randn(4, 16, 8, generator=g)
    want = _reference(x, w, sizes)
    for ends in (None, _ends(sizes).tolist()):
        got = grouped_matmul(x, w, _ends(sizes), "triton", ends)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_gemm_triton_is_refused_with_its_reason_where_it_cannot_run() -> None:
    cpu = torch.device("cpu")
    assert unavailable_reason(cpu, 256, 64) == "the Triton grouped GEMM runs on CUDA only"
    with pytest.raises(SpecError, match="gemm = triton: the Triton grouped GEMM runs on CUDA only"):
        resolve_gemm("triton", cpu, 256, 64)


def _cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    device = torch.device("cuda", 0)
    reason = unavailable_reason(device, 256, 128)
    if reason:
        pytest.skip(reason)
    return device


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [[256, 0, 300, 17, 129, 64, 65], [4100] * 2, [1] * 9])
def test_cuda_bf16_matches_torch_grouped_mm_forward_and_backward(sizes: list[int]) -> None:
    """In bfloat16 on the GPU: the same products as torch's CUTLASS kernel (both sum in K order in
    float32), forward, input and weight gradient."""
    device = _cuda()
    g = torch.Generator(device=device).manual_seed(3)
    k, n = 512, 768
    x = torch.randn(sum(sizes), k, generator=g, device=device).bfloat16().requires_grad_(True)
    w = (torch.randn(len(sizes), k, n, generator=g, device=device) * k**-0.5).bfloat16().requires_grad_(True)
    ends = _ends(sizes).to(device)
    gy = torch.randn(sum(sizes), n, generator=g, device=device).bfloat16()
    got = triton_grouped_mm(x, w, ends, max(sizes))
    got.backward(gy)
    xg, wg = x.grad, w.grad
    x.grad = w.grad = None
    want = torch._grouped_mm(x, w, offs=ends)
    want.backward(gy)
    for a, b in ((got, want), (xg, x.grad), (wg, w.grad)):
        assert a is not None and b is not None
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_cuda_layer_ffn_with_triton_matches_grouped() -> None:
    """The FFN with the activation fused into the Triton GEMM against torch's grouped kernel and activation,
    forward and every gradient, in bfloat16."""
    device = _cuda()
    g = torch.Generator(device=device).manual_seed(4)
    sizes = [300, 0, 200, 77, 129]
    hidden, inter = 512, 384
    w13 = (torch.randn(5, hidden, 2 * inter, generator=g, device=device) * hidden**-0.5).bfloat16()
    w2 = (torch.randn(5, inter, hidden, generator=g, device=device) * inter**-0.5).bfloat16()
    x = torch.randn(sum(sizes), hidden, generator=g, device=device).bfloat16()
    gy = torch.randn(sum(sizes), hidden, generator=g, device=device).bfloat16()
    ends = _ends(sizes).to(device)
    grads = []
    for impl in ("triton", "grouped"):
        weights = ExpertWeights(
            w13=w13.clone().requires_grad_(True), w2=w2.clone().requires_grad_(True), first_expert=0
        )
        xi = x.clone().requires_grad_(True)
        y = swiglu_ffn(xi, ends, weights, impl, act="triton", max_group=max(sizes))
        y.backward(gy)
        grads.append((y, xi.grad, weights.w13.grad, weights.w2.grad))
        with torch.no_grad():  # forward only: the fused kernel writes no h, same activation
            torch.testing.assert_close(
                swiglu_ffn(x, ends, weights, impl, act="triton", max_group=max(sizes)).float(), y.float()
            )
    for got, want in zip(*grads, strict=True):
        assert got is not None and want is not None
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_cuda_carve_out_gives_the_same_bits_on_fewer_programs() -> None:
    """On the GPU, the persistent launch under a 24-SM carve-out (what `comm = priority` at sms = 24 sets
    around the overlapped layer) gives the bits of the whole-GPU launch, forward and input gradient."""
    device = _cuda()
    g = torch.Generator(device=device).manual_seed(5)
    sizes = [300, 0, 200, 77, 129] * 8
    k, n = 1024, 1536
    x = torch.randn(sum(sizes), k, generator=g, device=device).bfloat16().requires_grad_(True)
    w = (torch.randn(len(sizes), k, n, generator=g, device=device) * k**-0.5).bfloat16()
    gy = torch.randn(sum(sizes), n, generator=g, device=device).bfloat16()
    ends = _ends(sizes).to(device)
    outs = []
    for held in (0, 24):
        with gemm_carveout(held, device):
            assert held_sms() == held
            y = triton_grouped_mm(x, w, ends, max(sizes))
            y.backward(gy)
        outs.append((y, x.grad))
        x.grad = None
    for got, want in zip(*outs, strict=True):
        assert got is not None and want is not None and torch.equal(got, want)


def test_tuned_tiles_name_the_autotuner_s_choice_per_gemm_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's gemm_triton_tiles: each tuned key (the kernel's autotune key) with the tile, warps,
    stages and tail its config holds; [] before any tuned launch."""
    import triton

    tuned = grouped_gemm._jit().triton_grouped_gemm_tuned
    monkeypatch.setattr(tuned, "cache", {})
    assert grouped_gemm.tuned_tiles() == []
    fc2 = triton.Config(
        {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "HALF_TAIL": True}, num_warps=8, num_stages=6
    )
    fc1 = triton.Config(
        {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "HALF_TAIL": False}, num_warps=8, num_stages=3
    )
    tuned.cache[(7168, 2048, False, False, False, True, 512, "torch.bfloat16")] = fc2
    tuned.cache[(2048, 7168, False, True, True, False, 512, "torch.bfloat16")] = fc1
    assert grouped_gemm.tuned_tiles() == [
        "fc1+swiglu N=2048 K=7168 rows<=512: 128x128x64 w8 s3",
        "gemm N=7168 K=2048 rows<=512, carved out: 128x256x32 w8 s6 half",
    ]
    other = (1536, 4096, False, True, True, False, 1024, "torch.bfloat16")  # another layer's fc1 (Qwen3)
    tuned.cache[other] = fc1
    assert len(grouped_gemm.tuned_tiles()) == 3
    assert grouped_gemm.tuned_tiles(hidden=7168, intermediate=2048) == [  # this layer's GEMMs only
        "fc1+swiglu N=2048 K=7168 rows<=512: 128x128x64 w8 s3",
        "gemm N=7168 K=2048 rows<=512, carved out: 128x256x32 w8 s6 half",
    ]
