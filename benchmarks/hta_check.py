"""Load a folder of moelab torch traces (one case: RUN_DIR/<backend>/traces/<case>/rank<R>.json) in
Holistic Trace Analysis and print what HTA sees: the profiler steps per rank (moelab makes each profiled
iteration a step) and the GPU kernel breakdown by kernel type and by kernel.

    python benchmarks/hta_check.py RUN_DIR/nccl-a2a/traces/CASE

Needs HTA (PyPI `HolisticTraceAnalysis` 0.5.0). Its metadata also asks for jupyterlab and pytest, which it
does not import; on a machine without the internet, carry these wheels and install them with --no-deps
(numpy is already there; match --python-version to the machine's python3):

    pip download --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux2014_x86_64 \
        -d .wheels/hta HolisticTraceAnalysis==0.5.0 pandas pytz plotly narwhals networkx pydot pyparsing \
        psutil python-dateutil six tzdata PyYAML        # about 30 MB
    pip install --no-deps --no-index .wheels/hta/*.whl
Exit code 1 when HTA finds no profiler step, or (unless --cpu) an empty kernel breakdown.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace_dir", type=Path, help="a folder holding rank<R>.json traces of one case")
    parser.add_argument("--cpu", action="store_true", help="a CPU trace: no kernels expected")
    parser.add_argument("--top", type=int, default=10, help="kernels listed")
    args = parser.parse_args(argv)
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        print(f"error: HolisticTraceAnalysis is not importable ({exc}): pip install HolisticTraceAnalysis")
        return 2
    if not sorted(args.trace_dir.glob("rank*.json")):
        print(f"error: no rank*.json traces in {args.trace_dir}")
        return 2
    logging.getLogger("hta").setLevel(logging.ERROR)
    analyzer = TraceAnalysis(trace_dir=str(args.trace_dir), include_last_profiler_step=True)
    steps = analyzer.get_profiler_steps()
    print(f"profiler steps seen by HTA: {[int(s) for s in steps]}")
    ok = bool(steps)
    if args.cpu:
        return 0 if ok else 1
    by_type, by_kernel = analyzer.get_gpu_kernel_breakdown(visualize=False, num_kernels=args.top)
    print("kernel time by kind:")
    print(by_type.to_string(index=False))
    print(f"top {args.top} kernels per rank:")
    cols = [c for c in ("name", "rank", "sum", "mean", "count", "kernel_type") if c in by_kernel.columns]
    print(by_kernel[cols].to_string(index=False) if cols else by_kernel.to_string())
    try:
        breakdown = analyzer.get_temporal_breakdown(visualize=False)
        print("temporal breakdown per rank (idle / compute / non-compute time):")
        print(breakdown.to_string(index=False))
    except Exception as exc:  # HTA indexes kernels without checking there are any
        print(f"temporal breakdown unavailable: {type(exc).__name__}: {exc}")
    return 0 if ok and not by_type.empty else 1


if __name__ == "__main__":
    sys.exit(main())
