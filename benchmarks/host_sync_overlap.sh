#!/usr/bin/env bash
# Issue 37, host-sync part, on 2 GPUs (~4 min; GPUS=4 for EP = 4), from the repository root:
#   bash benchmarks/host_sync_overlap.sh [RESULT_DIR]       (DEEPEP=DIR: a built DeepEP v1.2.1 tree)
# 0. tests/e2e/test_pair_counts_gpu.py: CUDA's sync detector over the overlapped layer (one GPU, ~30 s), and
#    tests/e2e/test_schedules_gpu.py (the GEMM tiles grouped and grouped-wide run, the partition's streams);
# 1. serial vs tbo vs expert/4 at the reference and DeepSeek-V3 presets, nccl-a2a and deepep, forward and
#    forward+backward (benchmarks/host_sync_overlap.toml), then benchmarks/overlap_summary.py's tables and
#    each case's schedule_overhead_us (was 1.7-3.8 ms per layer at EP 2 on H200, results/h200x2-r6);
# 2. the DeepSeek-V3 nccl-a2a tbo case again under --trace torch: benchmarks/kernel_gaps.py prints, per
#    profiled layer (tbo) and serial layer, the host syncs inside it and the GPU's idle gaps between kernels
#    (with the per-micro-batch sync gone: no cudaStreamSynchronize after each micro-batch's dispatch, and no
#    gap before the second micro-batch's dispatch), then benchmarks/overlap_from_trace.py's hidden share.
# NO_TRACE=1 skips step 2. WAIT_FOR=FILE: wait (at most 300 s) for FILE before the runs, e.g. a DeepEP build's marker.
# Results in RESULT_DIR (default /tmp/hs), copied to $OUT when set (the device tool's output folder).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD
if ls .whl/*.whl > /dev/null 2>&1; then  # the wheels results/h100x4-r6/run.sh installs, where carried
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
R=${1:-/tmp/hs}; mkdir -p "$R"
M="python3 -m moelab.cli.main"
S=benchmarks/host_sync_overlap.toml
DEEPEP=${DEEPEP:-build/ext/deepep-v1}
TRACED=h7168-t4096-k8-e128-uniform-s0-bf16-smdef-backward=True-bench=e2e-exchange=splits-intermediate=2048-mode=tbo
RUN=hs-ep${GPUS:-2}
COMMON="--db $R/moelab.duckdb --gpus ${GPUS:-2} --suite $S --iters 8 --warmup 2 --no-health --timeout 240"
git log --oneline -1 > "$R/commit.txt"; nvidia-smi --query-gpu=name --format=csv,noheader >> "$R/commit.txt"

CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/e2e/test_pair_counts_gpu.py \
  tests/e2e/test_schedules_gpu.py tests/e2e/test_wgrad.py \
  > "$R/gpu_tests.txt" 2>&1
tail -3 "$R/gpu_tests.txt"
if [ -n "${WAIT_FOR:-}" ]; then  # a DeepEP build running beside the GPU test: wait for its marker (<= 300 s)
  for _ in $(seq 150); do [ -f "$WAIT_FOR" ] && break; sleep 2; done
fi
timeout 280 $M run $COMMON --out "$R/runs" --backend nccl-a2a,deepep --backend-path deepep="$DEEPEP" \
  --run-id "$RUN" > "$R/run.txt" 2>&1
echo "exit $?" >> "$R/run.txt"; tail -4 "$R/run.txt"
if [ -z "${NO_TRACE:-}" ]; then  # NO_TRACE=1: the runs and tables only
  timeout 120 $M run $COMMON --out "$R/trace" --backend nccl-a2a --case "$TRACED" --trace torch --trace-iters 3 \
    --run-id hs-trace > "$R/trace.txt" 2>&1
  echo "exit $?" >> "$R/trace.txt"; tail -2 "$R/trace.txt"
fi

timeout 40 python3 benchmarks/overlap_summary.py --db "$R/moelab.duckdb" --run "$RUN" > "$R/summary.txt" 2>&1
timeout 40 python3 - "$R/moelab.duckdb" "$RUN" > "$R/overhead.txt" 2>&1 <<'PY'
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
rows = con.execute(
    "SELECT c.backend, c.case_id, c.status, m.name, m.value FROM cases c JOIN case_metrics m "
    "USING (run_id, case_id) WHERE c.run_id = ? AND m.name IN ('speedup_vs_serial', "
    "'speedup_vs_serial_fwd_bwd', 'schedule_overhead_us', 'layer_rel_err', 'grad_x_rel_err') ORDER BY 1, 2, 4",
    [sys.argv[2]],
).fetchall()
for backend, case, status, name, value in rows:
    mode = case.rsplit("mode=", 1)[-1]
    print(f"{backend:9s} {status:3s} {case.split('-smdef')[0]:34s} {mode:7s} {name:26s} {value:10.3f}")
for row in con.execute("SELECT backend, case_id, status, reason FROM cases WHERE run_id = ? AND status <> 'ok'", [sys.argv[2]]).fetchall():
    print("not ok:", *row)
PY
cat "$R/summary.txt" | head -40; cat "$R/overhead.txt"
for t in $(find "$R/trace" -path "*traces*" -name "rank0.json"); do
  echo "== $t"; timeout 60 python3 benchmarks/kernel_gaps.py "$t" --top 6
  timeout 60 python3 benchmarks/overlap_from_trace.py "$t" --name /layer
done 2>&1 | tee "$R/gaps.txt"
if [ -n "${OUT:-}" ]; then cp "$R/moelab.duckdb" "$OUT/hs.duckdb" 2>/dev/null; tar -C "$R" --exclude="*.duckdb*" -czf "$OUT/hs.tgz" .; fi
