"""Run a real alltoall_perf, keep its raw text and JSON outputs (new parser fixtures), parse both, and run
moelab.backends.nccl_tests.run_alltoall_perf over the reference workload's sizes.

    python3 benchmarks/nccl_tests_record.py --bin /path/to/nccl-tests/build --gpus 2 --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moelab.backends.nccl_tests import (  # noqa: E402
    aligned_size,
    alltoall_perf_argv,
    find_alltoall_perf,
    parse_json,
    parse_text,
    run_alltoall_perf,
    supports_json,
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=None, help="alltoall_perf or its directory (default: PATH)")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    exe = find_alltoall_perf(args.bin)
    has_json = supports_json(exe)
    print(f"binary {exe}, -J supported: {has_json}")

    # raw outputs over a range of sizes, for tests/fixtures/nccl_tests/
    json_path = args.out / "recorded.json"
    json_path.unlink(missing_ok=True)
    argv = alltoall_perf_argv(
        exe, 1 << 20, gpus=args.gpus, iters=20, warmup=5, json_path=json_path if has_json else None
    )
    argv[argv.index("-e") + 1] = str(1 << 28)  # 1 MiB .. 256 MiB
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    (args.out / "recorded.txt").write_text(done.stdout)
    (args.out / "recorded.stderr").write_text(done.stderr)
    text = parse_text(done.stdout)
    print("text:", text.status, len(text.rows), "rows, avg busbw", text.avg_busbw_gbps)
    if has_json and json_path.exists():
        js = parse_json(json_path.read_text())
        print("json:", js.status, len(js.rows), "rows, avg busbw", js.avg_busbw_gbps)
        assert [r.size_bytes for r in js.rows] == [r.size_bytes for r in text.rows]

    # the reference workload: 4096 tokens x 8192 hidden x bf16 per rank, x topk 8 (upper bound of rows)
    ranks = args.gpus
    sizes = [aligned_size(4096 * 8192 * 2 * k, ranks) for k in (1, 2, 4, 8)]
    run = run_alltoall_perf(sizes, binary=exe, gpus=args.gpus, iters=20, warmup=5)
    rows = [dict(status=r.status, source=r.source, rows=[vars_(x) for x in r.rows]) for r in run.results]
    (args.out / "run_alltoall_perf.json").write_text(json.dumps(rows, indent=1))
    for r in run.results:
        print(r.status, r.source, [(x.size_bytes, x.busbw_gbps_oop) for x in r.rows], r.problems)
    return 0 if all(r.ok for r in run.results) else 1


def vars_(row: object) -> dict[str, object]:
    return {f: getattr(row, f) for f in row.__dataclass_fields__}  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
