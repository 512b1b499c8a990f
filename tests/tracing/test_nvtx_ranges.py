"""NVTX range names, counting, and the CUDA profiler range."""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest
import torch

from moelab.tracing.nvtx_ranges import (
    IMPLS,
    cuda_profiler_range,
    nvtx_impl,
    nvtx_range,
    parse_range_name,
    range_name,
)


def test_range_names_follow_the_convention() -> None:
    assert range_name("nccl-a2a", "dispatch", "h8192-t4096") == "moelab/nccl-a2a/dispatch/h8192-t4096"
    assert range_name("deepep", "warmup", "c1") == "moelab/deepep/warmup/c1"
    assert range_name("deepep", "check", "c1") == "moelab/deepep/check/c1"
    # a '/' inside a part would add a level: it is replaced so names always parse back
    name = range_name("x", "pair", "a/b")
    assert name == "moelab/x/pair/a_b"
    assert parse_range_name(name) == ("x", "pair", "a_b")


def test_parse_range_name_rejects_other_names() -> None:
    assert parse_range_name("ProfilerStep#1") is None
    assert parse_range_name("moelab/only/two") is None
    assert parse_range_name("moelab/a//c") is None
    with pytest.raises(ValueError):
        range_name("", "dispatch", "c")


def test_noop_ranges_still_count_and_nest() -> None:
    counts: Counter[str] = Counter()
    outer, inner = range_name("b", "check", "c"), range_name("b", "dispatch", "c")
    with nvtx_range(outer, counts, impl="none"):
        for _ in range(3):
            with nvtx_range(inner, counts, impl="none"):
                pass
    assert counts == {outer: 1, inner: 3}


def test_range_counts_even_when_the_block_raises() -> None:
    counts: Counter[str] = Counter()
    with pytest.raises(RuntimeError), nvtx_range("moelab/b/dispatch/c", counts, impl="none"):
        raise RuntimeError("boom")
    assert counts["moelab/b/dispatch/c"] == 1


@pytest.mark.skipif(importlib.util.find_spec("nvtx") is None, reason="nvtx package not installed")
def test_nvtx_package_is_preferred_and_pushes_balanced_ranges() -> None:
    assert nvtx_impl() == "nvtx"
    counts: Counter[str] = Counter()
    with nvtx_range("moelab/b/dispatch/c", counts), nvtx_range("moelab/b/combine/c", counts):
        pass
    assert sum(counts.values()) == 2


def test_impl_choice_and_unknown_impl() -> None:
    assert nvtx_impl() in IMPLS
    with pytest.raises(ValueError, match="unknown NVTX"), nvtx_range("x", impl="roctx"):
        pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")
def test_cuda_profiler_range_is_a_noop_without_cuda() -> None:
    ran = []
    with cuda_profiler_range() as active:
        ran.append(active)
    assert ran == [False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_profiler_range_opens_on_gpu() -> None:
    with cuda_profiler_range() as active:
        torch.ones(1, device="cuda").add_(1)
    assert active is True
