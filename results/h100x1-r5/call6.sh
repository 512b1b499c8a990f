#!/usr/bin/env bash
# Round 5, call 6 on one lent H100, on the merged code: issue 29's `--repeat 3` chain (results/h100x1-repeat/
# call.sh) with its report (issue 30: the one-rank report drawn from a GPU store), then the e2e layer through
# `moelab run` at EP = 1 for the reference shape and every model preset (issue 27), stored in one database.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
M="python3 -m moelab.cli.main"
ROOT="$OUT"
mkdir -p "$ROOT/repeat" "$ROOT/e2e"
OUT="$ROOT/repeat" timeout 330 bash results/h100x1-repeat/call.sh > "$ROOT/repeat/chain.txt" 2>&1
echo "repeat chain exit $?" >> "$ROOT/repeat/chain.txt"
$M report --db "$ROOT/repeat/moelab.duckdb" --run repeat3 -o "$ROOT/repeat/report.html" >> "$ROOT/repeat/chain.txt" 2>&1
$M report --db "$ROOT/repeat/moelab.duckdb" --run repeat3 --format md -o "$ROOT/repeat/report.md" >> "$ROOT/repeat/chain.txt" 2>&1
for model in reference deepseek-v3 qwen3-235b-a22b mixtral-8x7b gpt-oss-120b; do
  timeout 100 $M run --gpus 1 --suite results/h100x1-r5/e2e_ep1.toml --model $model --iters 20 \
    --db "$ROOT/e2e/e2e.duckdb" --out /tmp/runs --label "e2e-ep1-$model" > "$ROOT/e2e/run_$model.txt" 2>&1
  echo "moelab run $model exit $?" >> "$ROOT/e2e/run_$model.txt"
done
$M db export --db "$ROOT/e2e/e2e.duckdb" --out "$ROOT/e2e/export" > /dev/null 2>&1
$M report --db "$ROOT/e2e/e2e.duckdb" --format md -o "$ROOT/e2e/report.md" > /dev/null 2>&1
rm -rf "$ROOT/repeat/runs"
grep -v "Warning\|return func" "$ROOT/repeat/chain.txt" | tail -45
for model in reference deepseek-v3 qwen3-235b-a22b mixtral-8x7b gpt-oss-120b; do tail -2 "$ROOT/e2e/run_$model.txt"; done
