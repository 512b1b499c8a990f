#!/usr/bin/env bash
# Issue 29's GPU check, prepared on CPU and not yet run: on one lent H100, `moelab run --repeat 3` of every
# built-in backend that runs there (the reference workload, library-default SMs), then its intervals per op
# and between backends (benchmarks/repeat_intervals.py), `moelab compare` and an export of the run.
#   run from the repository root with $OUT set (the device tool's output folder); EXTRA='--cpu --hidden 128
#   --tokens-per-rank 16 --topk 2 --experts-per-rank 2 --iters 6' runs the same chain on CPU ranks.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then  # duckdb, nvtx, platformdirs, nvidia-ml-py travel as wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
DB="$OUT/moelab.duckdb"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
BACKENDS=$(python3 -c '
from moelab.backends import registry
names = ("nccl-a2a", "mxfp8-a2a", "torch-symm-a2a", "nccl-ep", "deepep", "deepep-ll", "hybrid-ep", "uccl-ep")
print(",".join(n for n in names if registry.availability(n) is None))')
echo "backends available: $BACKENDS" | tee "$OUT/backends.txt"
timeout 540 python3 -m moelab.cli.main run --backend "$BACKENDS" --repeat 3 --sms default --label repeat3 \
  --db "$DB" --out "$OUT/runs" ${EXTRA:-} > "$OUT/run.txt" 2>&1
echo "moelab run exit $?" >> "$OUT/run.txt"
python3 benchmarks/repeat_intervals.py --db "$DB" --run repeat3 --reference nccl-a2a --json "$OUT/intervals.json" \
  > "$OUT/intervals.txt" 2>&1
COLUMNS=250 python3 -m moelab.cli.main compare --db "$DB" --run repeat3 --reference nccl-a2a \
  --html "$OUT/compare.html" > "$OUT/compare.txt" 2>&1
python3 -m moelab.cli.main db export --db "$DB" --out "$OUT/export" > /dev/null 2>&1
grep -v "Warning\|return func" "$OUT/run.txt" | tail -40
cat "$OUT/intervals.txt"
