#!/usr/bin/env bash
# Issue 31.2 and 31.4: the 4-backend reference suite with --repeat 3 (round 4: 83 s warm for one start of each
# backend), its intervals between the starts, compare and report with % of the fabric bound from the run's
# measured peaks, and moelab model's bound for this machine from the same run.
source results/h200x2-r5/prelude.sh
/usr/bin/time -f "wall %e s" timeout 420 $M run $DB --backend nccl-a2a,mxfp8-a2a,deepep,hybrid-ep $LIBS \
  --experts-per-rank 8 --dtype bf16,fp8 --repeat 3 --timeout 240 --label r5-suite-repeat3 > "$R/suite.txt" 2>&1
echo "exit $?" >> "$R/suite.txt"
python3 benchmarks/repeat_intervals.py --db $R/moelab.duckdb --run r5-suite-repeat3 --reference nccl-a2a \
  --json "$R/intervals.json" > "$R/intervals.txt" 2>&1
COLUMNS=250 $M compare --db $R/moelab.duckdb --run r5-suite-repeat3 --reference nccl-a2a --html "$R/compare.html" > "$R/compare.txt" 2>&1
$M report --db $R/moelab.duckdb --run r5-suite-repeat3 -o "$R/report.html" > "$R/report.txt" 2>&1
$M report --db $R/moelab.duckdb --run r5-suite-repeat3 --format md -o "$R/report.md" >> "$R/report.txt" 2>&1
$M model --db $R/moelab.duckdb --from-run r5-suite-repeat3 --json > "$R/model_bound.json" 2> "$R/model_bound.txt"
$M model --db $R/moelab.duckdb --from-run r5-suite-repeat3 >> "$R/model_bound.txt" 2>&1
$M db export --db $R/moelab.duckdb --format parquet -o "$R/export" > /dev/null 2>&1
finish call2
grep -v "Warning\|return func" "$R/suite.txt" | tail -30; head -40 "$R/intervals.txt"; tail -20 "$R/model_bound.txt"
