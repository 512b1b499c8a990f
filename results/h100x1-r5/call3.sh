#!/usr/bin/env bash
# Round 5, call 3 on one lent H100: where the expert compute's non-GEMM time goes (forward+backward under
# torch.profiler) for the shapes whose backward was above 1.5x its HBM floor in call 2, and the e2e layer
# benchmark for the two presets that ran out of memory there (now each shape in its own process).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
for s in mixtral-8x7b reference deepseek-v3; do
  timeout 150 python3 benchmarks/e2e_profile_gpu.py --shape $s --tokens 4096 > "$OUT/profile_$s.txt" 2>&1
done
timeout 300 python3 benchmarks/e2e_layer_gpu.py --shapes qwen3-235b-a22b,gpt-oss-120b --json "$OUT/e2e_layer2.json" > "$OUT/e2e_layer2.txt" 2>&1
for s in mixtral-8x7b reference deepseek-v3; do grep -v "Warning\|return func\|Guessing" "$OUT/profile_$s.txt" | head -24; done
grep -v "UserWarning\|return func\|Guessing device" "$OUT/e2e_layer2.txt" | tail -12
