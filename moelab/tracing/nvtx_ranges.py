"""Named ranges around every timed region, so any external profiler (nsys, ncu, torch.profiler with
NVTX) shows which backend, op and case a kernel belongs to.

Names: `moelab/<backend>/<op>/<case>` for the timed ops (dispatch, combine, pair) and
`moelab/<backend>/warmup/<case>`, `moelab/<backend>/check/<case>` for the warm-up and correctness phases.

Where the ranges go, chosen once per process: the `nvtx` package when importable (it works without CUDA
and costs ~0.3 us per push/pop when no tool listens), else torch.cuda.nvtx when CUDA is present, else
nowhere. In every case a range can be counted into a caller's Counter, which gives the per-range call
counts that kernel-only time per call needs, and lets tests see that ranges were opened.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from moelab.core import ops as core_ops

PREFIX = "moelab/"
OPS = tuple(core_ops.OPS)
PHASES = ("warmup", "check")
IMPLS = ("nvtx", "torch.cuda.nvtx", "none")


def _clean(part: str) -> str:
    """A name part without '/', so the name keeps exactly four levels."""
    text = str(part).strip().replace("/", "_")
    if not text:
        raise ValueError("range name parts must not be empty")
    return text


def range_name(backend: str, op: str, case_id: str) -> str:
    """`moelab/<backend>/<op>/<case>`; `op` is a timed op or a phase ("warmup", "check")."""
    return f"{PREFIX}{_clean(backend)}/{_clean(op)}/{_clean(case_id)}"


def parse_range_name(name: str) -> tuple[str, str, str] | None:
    """(backend, op, case_id) of a moelab range name, None for any other name."""
    if not name.startswith(PREFIX):
        return None
    parts = name[len(PREFIX) :].split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


@functools.cache
def nvtx_impl() -> str:
    """Which NVTX emitter this process uses: "nvtx", "torch.cuda.nvtx" or "none"."""
    try:
        import nvtx  # noqa: F401

        return "nvtx"
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return "torch.cuda.nvtx"
    except ImportError:
        pass
    return "none"


def _emitter(impl: str) -> tuple[Any, Any]:
    if impl == "nvtx":
        import nvtx

        return (lambda name: nvtx.push_range(message=name)), nvtx.pop_range
    if impl == "torch.cuda.nvtx":
        import torch.cuda.nvtx as tnvtx

        return tnvtx.range_push, tnvtx.range_pop
    if impl == "none":
        return (lambda name: None), (lambda: None)
    raise ValueError(f"unknown NVTX implementation {impl!r}; use one of {', '.join(IMPLS)}")


@contextmanager
def nvtx_range(name: str, counts: Counter[str] | None = None, impl: str | None = None) -> Iterator[None]:
    """Push an NVTX range named `name` for the block (a thread range: push/pop on this thread).

    `counts[name]` is incremented when the range opens, whatever the emitter, so a caller can tell how
    many instances of each range a trace should hold. `impl` overrides the per-process choice.
    """
    push, pop = _emitter(impl or nvtx_impl())
    if counts is not None:
        counts[name] += 1
    push(name)
    try:
        yield
    finally:
        pop()


@contextmanager
def cuda_profiler_range() -> Iterator[bool]:
    """cudaProfilerStart/Stop around the block (the capture range of `nsys --capture-range=cudaProfilerApi`
    and of `ncu --profile-from-start off`). Yields whether a CUDA profiler range was opened (False
    without CUDA). The device is synchronized at both ends so the range holds exactly the block's work.
    """
    import torch

    if not torch.cuda.is_available():
        yield False
        return
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    try:
        yield True
    finally:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
