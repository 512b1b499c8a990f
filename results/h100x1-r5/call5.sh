#!/usr/bin/env bash
# Round 5, call 5 on one lent H100: the Triton kernels with row x column tiles autotuned per row width and
# int16 sort keys (issue 27): their GPU tests, then the e2e layer benchmark over every shape.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/e2e/test_permute.py tests/e2e/test_e2e_layer.py > "$OUT/gpu_tests.txt" 2>&1
timeout 120 python3 benchmarks/e2e_profile_gpu.py --shape gpt-oss-120b --tokens 4096 > "$OUT/profile_gpt-oss.txt" 2>&1
timeout 420 python3 benchmarks/e2e_layer_gpu.py --json "$OUT/e2e_layer.json" > "$OUT/e2e_layer.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
grep -v "Warning\|return func\|Guessing" "$OUT/profile_gpt-oss.txt" | head -14
grep -v "UserWarning\|return func\|Guessing device" "$OUT/e2e_layer.txt" | tail -26
