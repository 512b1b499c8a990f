#!/usr/bin/env bash
# Issue 31.3: the lean MoE layer at EP = 2, serial and tbo, forward and forward + backward, for the four backends at
# the reference shape (8 experts per rank) and for Mixtral-8x7B's shape, each case with its roofline.
source results/h200x2-r5/prelude.sh
timeout 330 $M run $DB --gpus 2 --suite results/h200x2-r5/e2e_ep2.toml --backend nccl-a2a,mxfp8-a2a,deepep,hybrid-ep \
  $LIBS --iters 20 --warmup 5 --trace torch --trace-iters 3 --label r5-e2e-ref > "$R/e2e_ref.txt" 2>&1
echo "exit $?" >> "$R/e2e_ref.txt"
timeout 200 $M run $DB --gpus 2 --suite results/h200x2-r5/e2e_ep2.toml --backend nccl-a2a,deepep $LIBS \
  --model mixtral-8x7b --iters 20 --warmup 5 --label r5-e2e-mixtral > "$R/e2e_mixtral.txt" 2>&1
echo "exit $?" >> "$R/e2e_mixtral.txt"
$M db export --db $R/moelab.duckdb --format parquet -o "$R/export" > /dev/null 2>&1
finish call3
for f in e2e_ref e2e_mixtral; do grep -v "^│\|^┃\|^┏\|^┡\|^└" "$R/$f.txt" | tail -12; done
