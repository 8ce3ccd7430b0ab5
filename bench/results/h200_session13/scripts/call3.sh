#!/bin/bash
# Session 13, call 3: the DeltaNet / Gated DeltaNet side-by-side with fla and the article's kernels on this build
# (every pass), then bench_delta_rule_cuda's DeltaNet benchmarks alone for bench/results/delta_rule_cuda_h200.json.
set -u
tar -xJf .dev-pack/sbs.tar.xz
mkdir -p /tmp/sbs && OUT=/tmp/sbs timeout 420 bash bench/h200/side_by_side.sh delta,gated-delta --budget-s 360 > /tmp/sbs/run.txt 2>&1
echo "side by side rc=$?" > $OUT/summary.txt
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
timeout 120 $B/bench/bench_delta_rule_cuda --benchmark_filter='BM_DeltaRule(Backward|ForwardBackward|Forward/|WyPrepare|Decode)' \
  --benchmark_out=/tmp/sbs/bench_delta.json --benchmark_out_format=json > /tmp/sbs/bench_delta.txt 2>&1
echo "bench delta rc=$?" >> $OUT/summary.txt
tar -czf $OUT/sbs.tgz -C /tmp/sbs .
cat $OUT/summary.txt; grep -E '^[0-9:]+ == |done' /tmp/sbs/run.txt | cut -c1-160
grep -E "_median" /tmp/sbs/bench_delta.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'
