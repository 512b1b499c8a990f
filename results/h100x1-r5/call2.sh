#!/usr/bin/env bash
# Round 5, call 2 on one lent H100: the e2e layer benchmark at EP = 1 for the reference shape and every
# model preset (issue 27), after the unsplit-at-EP=1 schedule, the random-data rates and the OOM retry.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt"
timeout 540 python3 benchmarks/e2e_layer_gpu.py --json "$OUT/e2e_layer.json" > "$OUT/e2e_layer.txt" 2>&1
echo "e2e_layer exit $?" >> "$OUT/e2e_layer.txt"
grep -v "UserWarning\|return func\|Guessing device" "$OUT/e2e_layer.txt" | tail -60
