#!/usr/bin/env bash
# Round 5, call 4 on one lent H100: doctor five times (issue 26), the e2e layer benchmark over every shape
# (issue 27), and the e2e layer through `moelab run` at EP = 1 for the reference shape and Mixtral, stored.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python3 benchmarks/health_doctor_gpu.py --out "$OUT/doctor" --doctor-runs 5 --only-doctor-runs > "$OUT/doctor.txt" 2>&1
timeout 330 python3 benchmarks/e2e_layer_gpu.py --json "$OUT/e2e_layer.json" > "$OUT/e2e_layer.txt" 2>&1
for model in reference mixtral-8x7b; do
  timeout 120 python3 -m moelab.cli.main run --gpus 1 --suite results/h100x1-r5/e2e_ep1.toml --model $model \
    --iters 20 --db "$OUT/e2e_ep1.duckdb" --out /tmp/runs --label "e2e-ep1-$model" >> "$OUT/e2e_ep1.txt" 2>&1
  echo "moelab run $model exit $?" >> "$OUT/e2e_ep1.txt"
done
tail -8 "$OUT/doctor.txt"
grep -v "UserWarning\|return func\|Guessing device" "$OUT/e2e_layer.txt" | tail -9
tail -40 "$OUT/e2e_ep1.txt"
