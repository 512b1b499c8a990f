#!/usr/bin/env bash
# Issue 31.1: moelab verify for DeepEP V1, Hybrid-EP and nccl-tests at the reference workload and the two other
# configurations of results/h200x2-r3 (call 2), one label each; then the health of the machine. About 9 minutes.
source results/h200x2-r5/prelude.sh
$M doctor --json > "$R/doctor.json" 2> "$R/doctor.txt"
V="$M verify --backend deepep,hybrid-ep,nccl-tests $LIBS --nccl-tests-bin .ext/nccl-tests/build/alltoall_perf $DB --topk 8 --experts-per-rank 8"
timeout 200 $V --hidden 8192 --tokens-per-rank 4096 --label r5-verify-ref > "$R/verify_ref.txt" 2>&1; echo "exit $?" >> "$R/verify_ref.txt"
timeout 170 $V --hidden 4096 --tokens-per-rank 2048 --label r5-verify-h4096 > "$R/verify_h4096.txt" 2>&1; echo "exit $?" >> "$R/verify_h4096.txt"
timeout 170 $V --hidden 7168 --tokens-per-rank 1024 --label r5-verify-h7168 > "$R/verify_h7168.txt" 2>&1; echo "exit $?" >> "$R/verify_h7168.txt"
$M db export --db $R/moelab.duckdb --format parquet -o "$R/export" > /dev/null 2>&1
finish call1
tail -25 "$R/verify_ref.txt" "$R/verify_h4096.txt" "$R/verify_h7168.txt"
