#!/usr/bin/env bash
# Issue 38 on 2 GPUs (nvidia-h100-x2 or nvidia-h200-x2): the gate's noise learned from real history, the
# one ranking rule and check --history, on runs of the same code. Run from the repository root (with the
# project installed the way the other rounds' call scripts do); writes under $OUT.
# What to look for:
#  - check.md: every op of g6 against g5 is unchanged or "cannot judge ... use --repeat N" (never a
#    regression: same code); the noise each op was held to ("CV x% between processes, learned from 4
#    earlier runs") should be <= ~0.5% for dispatch/combine/pair and several % for layout/dispatch_fresh/
#    roundtrip, as issue 38 measured on 2xH200.
#  - history.txt: "0 steps in N series" (no change between runs of the same code).
#  - compare.txt: no 'faster' or 'slower' between g5 and g6 (same code), marks column present.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
DB=/tmp/gate38.duckdb
for i in 1 2 3 4 5 6; do
  timeout 300 python3 -m moelab.cli.main run --gpus 2 --backend nccl-a2a --repeat 3 --iters 50 --no-health \
    --db "$DB" --out /tmp/runs38 --run-id "g$i" > "$OUT/run_g$i.txt" 2>&1
  echo "run g$i exit $?" >> "$OUT/runs.txt"
done
python3 -m moelab.cli.main check --db "$DB" --baseline g5 --run g6 --all --summary "$OUT/check.md" > "$OUT/check.txt" 2>&1
echo "check exit $?" >> "$OUT/check.txt"
python3 -m moelab.cli.main check --db "$DB" --history > "$OUT/history.txt" 2>&1
echo "history exit $?" >> "$OUT/history.txt"
COLUMNS=250 python3 -m moelab.cli.main compare --db "$DB" --by run --run g5 --run g6 > "$OUT/compare.txt" 2>&1
echo "compare exit $?" >> "$OUT/compare.txt"
tail -3 "$OUT/runs.txt"; cat "$OUT/check.md" | head -40; cat "$OUT/history.txt"; tail -20 "$OUT/compare.txt"
