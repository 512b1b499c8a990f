#!/usr/bin/env bash
# Issue 35: the 4-GPU reference workload (2 experts per rank, HIDDEN 8192, 4096 tokens, topk 8, uniform)
# measured with the concurrent link capacity; one device call. Outputs under $OUT (or ./out).
set -euo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
M="python3 -m moelab.cli.main"
DB="--db $OUT/m.duckdb"
GPUS=$(nvidia-smi -L | wc -l)
BACKENDS=${BACKENDS:-nccl-a2a,deepep}
BP=${BP:-"--backend-path deepep=.ext/deepep-v1"}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
$M run $DB --out "$OUT/runs" --backend "$BACKENDS" $BP --gpus "$GPUS" --dtype bf16,fp8 \
   --hidden 8192 --tokens-per-rank 4096 --topk 8 --experts-per-rank 2 --sms default,32 \
   --label "h200x${GPUS}-bounds" 2>&1 | tee "$OUT/console.txt"
$M db query $DB "SELECT name, round(gbps, 1) AS gbps, definition FROM measured_peaks ORDER BY name" > "$OUT/peaks.txt"
$M report $DB --run "h200x${GPUS}-bounds" --format md -o "$OUT/report.md"
$M report $DB --run "h200x${GPUS}-bounds" -o "$OUT/report.html"
# the gate's above-bound flags of the stored run (moelab.gate.above), whatever the verdict
python3 - "$OUT/m.duckdb" "h200x${GPUS}-bounds" > "$OUT/above.txt" <<'PY'
import sys
from pathlib import Path
from moelab.gate.above import above_bound_flags
from moelab.reports.run_view import load_view
from moelab.store.db import open_db
from moelab.store.labels import resolve_run
with open_db(Path(sys.argv[1]), read_only=True) as con:
    run = resolve_run(con, sys.argv[2])
    print("\n".join(above_bound_flags(load_view(con, run).results)))
PY
$M db export $DB --run "h200x${GPUS}-bounds" --format parquet --out "$OUT/export"
echo "done: $(wc -l < "$OUT/above.txt") figure(s) above 100% (each flagged with its cause)"
