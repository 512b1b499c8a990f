#!/usr/bin/env bash
# Issue 37 on a lent 4-GPU machine (nvidia-h100-x4 or nvidia-h200-x4), from the repository root with `.whl`
# (duckdb, nvtx, platformdirs, nvidia-ml-py wheels) and `.ext/deepep-v1` (DeepEP v1.2.1, built in place as
# results/h200x2/README.md says) carried. Steps, each under a device call's 10 minutes:
#   bash results/h100x4-r6/run.sh gemm ep2      # GPU tests, the GEMM variants (~1.5 min), EP = 2 (~3 min)
#   bash results/h100x4-r6/run.sh ep4 summary   # EP = 4 (~3 min), then the acceptance tables and report
# (same warm machine: the store is /tmp/r6/moelab.duckdb; each call also returns it as $OUT/r6.duckdb).
#   gemm:    tests/e2e/test_schedules_gpu.py, then benchmarks/grouped_gemm_gpu.py (one GPU);
#   ep2/ep4: every preset x every schedule (results/h100x4-r6/schedules.toml), nccl-a2a and deepep,
#            forward and forward+backward, each case timing its own serial layer;
#   summary: benchmarks/overlap_summary.py (best schedule per preset, EP, backend against what the issue
#            asks; exposed share of serial; GEMM % of dense) and the report's layer section (report.md).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
M="python3 -m moelab.cli.main"
R=/tmp/r6; mkdir -p "$R"
DB="--db $R/moelab.duckdb --out $R/runs"
LIBS="--backend-path deepep=${DEEPEP:-.ext/deepep-v1}"  # DEEPEP: a DeepEP v1.2.1 build elsewhere
S=results/h100x4-r6/schedules.toml
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
python3 -c "import torch, torch.distributed as d, torch.cuda.green_contexts as g; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'green contexts', g.SUPPORTED, 'cta_policy', hasattr(d.ProcessGroupNCCL.Options().config, 'cta_policy'))" >> "$R/gpu.txt" 2>&1
cat "$R/gpu.txt"

for step in "$@"; do
  case "$step" in
    gemm)
      timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/e2e/test_schedules_gpu.py > "$R/gpu_tests.txt" 2>&1
      tail -3 "$R/gpu_tests.txt"
      CUDA_VISIBLE_DEVICES=0 timeout 170 python3 benchmarks/grouped_gemm_gpu.py --json "$R/grouped_gemm.json" > "$R/grouped_gemm.txt" 2>&1
      grep -v "Warning\|return func" "$R/grouped_gemm.txt" | tail -40 ;;
    ep2|ep4)
      ep=${step#ep}
      /usr/bin/time -f "wall %e s" timeout 400 $M run $DB --gpus $ep --suite $S --backend nccl-a2a,deepep $LIBS \
        --iters 8 --warmup 2 --no-health --timeout 300 --run-id r6-ep$ep > "$R/run_ep$ep.txt" 2>&1
      echo "exit $?" >> "$R/run_ep$ep.txt"; tail -6 "$R/run_ep$ep.txt" ;;
    summary)
      runs=$(for e in 2 4; do [ -f "$R/run_ep$e.txt" ] && printf "r6-ep%s," $e; done)
      python3 benchmarks/overlap_summary.py --db "$R/moelab.duckdb" --run "${runs%,}" > "$R/summary.txt" 2>&1
      $M report --db "$R/moelab.duckdb" $(for r in ${runs//,/ }; do printf -- "--run %s " $r; done) --format md \
        -o "$R/report.md" > /dev/null 2>&1
      cat "$R/summary.txt"; grep -A12 "Best overlapped schedule" "$R/report.md" | head -60 ;;
    *) echo "unknown step $step (gemm, ep2, ep4, summary)" ;;
  esac
done
tar -C "$R" --exclude="*.duckdb*" -czf "$OUT/r6-$(echo "$@" | tr ' ' '-').tgz" . ; cp "$R/moelab.duckdb" "$OUT/r6.duckdb" 2>/dev/null

# optional, where a schedule loses: its kernel timeline (then benchmarks/overlap_from_trace.py on a rank's trace):
#   $M run $DB --gpus 2 --suite $S --backend deepep $LIBS --case CASE_ID --trace torch --trace-iters 3 --run-id r6-trace
# optional, DeepEP's hook-based receive (deepep-ll, forward only: it has no dispatch along a handle):
#   $M run $DB --gpus 2 --backend deepep-ll $LIBS --suite results/h100x4-r6/hook.toml --run-id r6-hook
