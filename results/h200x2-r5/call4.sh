#!/usr/bin/env bash
# Issue 31.3 (tune): moelab tune over the four backends at the reference shape (round 3: 271 s, 39 trials), then
# its winner re-measured in a run of its own (round 3: within 0.9% of tune's figure).
source results/h200x2-r5/prelude.sh
timeout 400 $M tune $DB --backend deepep,hybrid-ep,nccl-a2a,mxfp8-a2a $LIBS --sms 16,24,32 --experts-per-rank 8 \
  --suite-out "$R/tuned.toml" > "$R/tune.txt" 2>&1
echo "exit $?" >> "$R/tune.txt"
[ -s "$R/tuned.toml" ] && timeout 150 $M run $DB --gpus 2 --suite "$R/tuned.toml" $LIBS --iters 50 \
  --label r5-tuned-remeasure > "$R/remeasure.txt" 2>&1
echo "exit $?" >> "$R/remeasure.txt"
$M db export --db $R/moelab.duckdb --format parquet -o "$R/export" > /dev/null 2>&1
finish call4
tail -25 "$R/tune.txt"; grep -v "^│\|^┃\|^┏\|^┡\|^└" "$R/remeasure.txt" | tail -8
