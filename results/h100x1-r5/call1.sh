#!/usr/bin/env bash
# Round 5, call 1 on one lent H100/H200: the e2e layer benchmark (issue 27) and --trace nsys through moelab
# with the nsys bundled in Nsight Compute (issue 26). Run from the repository root with .whl carried.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)" >> "$OUT/gpu.txt"
timeout 420 python3 benchmarks/e2e_layer_gpu.py --json "$OUT/e2e_layer.json" > "$OUT/e2e_layer.txt" 2>&1
echo "e2e_layer exit $?" >> "$OUT/e2e_layer.txt"
NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | head -1)
{ echo "nsys: $NSYS"; find /opt/nvidia -name 'QdstrmImporter*' 2>/dev/null; } > "$OUT/nsys_run.txt"
PATH="$(dirname "$NSYS"):$PATH" timeout 300 python3 -m moelab.cli.main run --gpus 1 --sms default --iters 20 \
  --trace nsys --no-health --db /tmp/m.duckdb --out /tmp/runs --run-id nsys-h100 >> "$OUT/nsys_run.txt" 2>&1
echo "moelab run exit $?" >> "$OUT/nsys_run.txt"
ls -laR /tmp/runs/nsys-h100/nccl-a2a/traces >> "$OUT/nsys_run.txt" 2>&1
tail -5 /tmp/runs/nsys-h100/nccl-a2a/rank0.log >> "$OUT/nsys_run.txt" 2>&1
cat "$OUT/e2e_layer.txt" | tail -40
tail -25 "$OUT/nsys_run.txt"
