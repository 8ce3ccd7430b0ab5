#!/bin/bash
# Session 16, call 2, on the final kernels (call 1's): the side-by-side with fla and the article's kernels for
# DeltaNet and Gated DeltaNet (the training step's oracle check of one head at the benchmark shape), then
# bench_delta_rule_cuda in full (the report's JSON).
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r && tar -xJf .dev-pack/sbs.tar.xz
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
FINAL_OUT=$OUT
mkdir -p /tmp/sbs && OUT=/tmp/sbs timeout 300 bash bench/h200/side_by_side.sh delta,gated-delta --budget-s 240 > /tmp/sbs/run.txt 2>&1
echo "side by side rc=$?" >> $FINAL_OUT/runs.txt
OUT=$FINAL_OUT
mkdir -p /tmp/bj && start=$(date +%s)
LD_LIBRARY_PATH=/tmp/r/lib timeout 120 $B/bench/bench_delta_rule_cuda --benchmark_out=/tmp/bj/full.json --benchmark_out_format=json > /tmp/bj/full.txt 2>&1
echo "full rc=$? $(( $(date +%s) - start )) s" >> $OUT/runs.txt
cp /tmp/bj/full.json $OUT/full.json
cp /tmp/sbs/side_by_side_*.json $OUT/ 2>/dev/null
tar -czf $OUT/out.tgz -C /tmp sbs bj
cat $OUT/gpu.txt $OUT/runs.txt; grep -E '^[0-9:]+ == ' /tmp/sbs/run.txt | cut -c1-150
echo "== full (C = 64)"; grep -E "_median" /tmp/bj/full.txt | grep -E "C:64" | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'
