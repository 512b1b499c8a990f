"""Traces: NVTX ranges around timed regions, torch.profiler and nsys captures, and kernel-only time.

nvtx_ranges  names and opens the ranges (`moelab/<backend>/<op>/<case>`), and the CUDA profiler range
torch_trace  torch.profiler capture → Chrome JSON per rank; the Chrome-trace summary per range
nsys         the per-rank `nsys profile` prefix, `nsys export --type sqlite`, the SQLite reader
wrap         `--wrap 'ncu …'` prefixes and splicing a wrapper into a launcher's argv
summary      the result types shared by both readers
kernel_time  kernel-only time per op call, for the worker to store beside the event-timed figure
"""

from moelab.tracing.kernel_time import OpKernelTime, op_kernel_times
from moelab.tracing.nvtx_ranges import cuda_profiler_range, nvtx_range, parse_range_name, range_name
from moelab.tracing.summary import KernelShare, RangeSummary, TraceSummary

__all__ = [
    "KernelShare",
    "OpKernelTime",
    "RangeSummary",
    "TraceSummary",
    "cuda_profiler_range",
    "nvtx_range",
    "op_kernel_times",
    "parse_range_name",
    "range_name",
]
