#!/usr/bin/env bash
# Issue 37 on a lent 4-GPU machine (nvidia-h100-x4 or nvidia-h200-x4), from the repository root with `.whl`
# (duckdb, nvtx, platformdirs, nvidia-ml-py wheels) and `.ext/deepep-v1` (DeepEP v1.2.1, built in place as
# results/h200x2/README.md says) carried. About 4-6 minutes of device time; prints the acceptance tables.
#   1. the expert GEMMs beside the dense rate (one GPU, about a minute);
#   2. every preset x every schedule, nccl-a2a and deepep, EP = 2 then EP = 4, forward and forward+backward;
#   3. the compact acceptance tables (benchmarks/overlap_summary.py) and the report's layer section.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
M="python3 -m moelab.cli.main"
R=/tmp/r6; mkdir -p "$R"
DB="--db $R/moelab.duckdb --out $R/runs"
LIBS="--backend-path deepep=.ext/deepep-v1"
S=results/h100x4-r6/schedules.toml
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
python3 -c "import torch, torch.distributed as d; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'green contexts', __import__('torch.cuda.green_contexts').cuda.green_contexts.SUPPORTED, 'cta_policy', hasattr(d.ProcessGroupNCCL.Options().config, 'cta_policy'))" >> "$R/gpu.txt" 2>&1

timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/e2e/test_schedules_gpu.py > "$R/gpu_tests.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/grouped_gemm_gpu.py --json "$R/grouped_gemm.json" > "$R/grouped_gemm.txt" 2>&1
for ep in 2 4; do
  timeout 300 $M run $DB --gpus $ep --suite $S --backend nccl-a2a,deepep $LIBS --iters 8 --warmup 2 \
    --no-health --timeout 240 --run-id r6-ep$ep > "$R/run_ep$ep.txt" 2>&1
  echo "exit $?" >> "$R/run_ep$ep.txt"
done
# optional, where a schedule loses: its kernel timeline (then benchmarks/overlap_from_trace.py on a rank's trace):
# timeout 200 $M run $DB --gpus 2 --suite $S --backend deepep $LIBS --case CASE_ID --trace torch --trace-iters 3 \
#   --run-id r6-trace > "$R/run_trace.txt" 2>&1
# optional, DeepEP's hook-based receive (deepep-ll, forward only: it has no dispatch along a handle):
# timeout 120 $M run $DB --gpus 2 --backend deepep-ll $LIBS --suite results/h100x4-r6/hook.toml --run-id r6-hook \
#   > "$R/run_hook.txt" 2>&1
python3 benchmarks/overlap_summary.py --db "$R/moelab.duckdb" --run r6-ep2,r6-ep4 > "$R/summary.txt" 2>&1
$M report --db "$R/moelab.duckdb" --run r6-ep2 --run r6-ep4 --format md -o "$R/report.md" > /dev/null 2>&1
tar -C "$R" --exclude="*.duckdb*" -czf "$OUT/r6.tgz" . ; cp "$R/moelab.duckdb" "$OUT/r6.duckdb" 2>/dev/null
cat "$R/gpu.txt"; tail -3 "$R/gpu_tests.txt"; grep -v "Warning\|return func" "$R/grouped_gemm.txt" | tail -40
tail -4 "$R/run_ep2.txt" "$R/run_ep4.txt"; cat "$R/summary.txt"
