#!/usr/bin/env bash
# Round 5, call 7 on one lent H100 (the last of this session's device time): after call 6 found torch-symm-a2a
# started at one rank (now refused by its plan), `moelab report` crashing on the machine's typer (fixed) and the
# 128/256-expert presets' forward+backward check out of memory (the float32 weight gradients are now compared
# one expert at a time): the `--repeat 3` chain of nccl-a2a and mxfp8-a2a with its report, then DeepSeek-V3
# through `moelab run` at EP = 1. Outputs travel as two archives (at most 8 files come back).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
M="python3 -m moelab.cli.main"
R=/tmp/r7
mkdir -p $R/repeat $R/e2e
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > $R/repeat/gpu.txt 2>&1
timeout 150 $M run --backend nccl-a2a,mxfp8-a2a --repeat 3 --sms default --label repeat3 \
  --db $R/repeat/moelab.duckdb --out $R/runs > $R/repeat/run.txt 2>&1
echo "moelab run exit $?" >> $R/repeat/run.txt
python3 benchmarks/repeat_intervals.py --db $R/repeat/moelab.duckdb --run repeat3 --reference nccl-a2a \
  --json $R/repeat/intervals.json > $R/repeat/intervals.txt 2>&1
COLUMNS=250 $M compare --db $R/repeat/moelab.duckdb --run repeat3 --reference nccl-a2a > $R/repeat/compare.txt 2>&1
$M report --db $R/repeat/moelab.duckdb --run repeat3 -o $R/repeat/report.html > $R/repeat/report.txt 2>&1
$M report --db $R/repeat/moelab.duckdb --run repeat3 --format md -o $R/repeat/report.md >> $R/repeat/report.txt 2>&1
for model in deepseek-v3; do
  timeout 80 $M run --gpus 1 --suite results/h100x1-r5/e2e_ep1.toml --model $model --iters 20 \
    --db $R/e2e/e2e.duckdb --out $R/runs --label "e2e-ep1-$model" > $R/e2e/run_$model.txt 2>&1
  echo "moelab run $model exit $?" >> $R/e2e/run_$model.txt
done
tar -C $R -czf "$OUT/repeat.tgz" repeat
tar -C $R -czf "$OUT/e2e.tgz" e2e
tar -C $R -czf "$OUT/logs.tgz" --exclude='*.json' runs 2>/dev/null
grep -v "Warning\|return func" $R/repeat/run.txt | tail -22
cat $R/repeat/intervals.txt | head -40
tail -3 $R/repeat/report.txt
for model in deepseek-v3; do grep -v "^│\|^┃\|^┏\|^┡\|^└" $R/e2e/run_$model.txt | tail -6; done
