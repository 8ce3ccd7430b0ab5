#!/bin/bash
# Session 13, call 2: call 1's build (16 value rows per streamed tile) and this one (32 at C = 64) alternating twice
# (stage 4 and forward + backward); on this build: the backward and strides suites with CI's seed and seeds 21..30,
# every backward device test under memcheck, racecheck, synccheck and initcheck; one ncu profile of stage 4 at C = 64.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
xz -dc .dev-pack/bench_single16.xz > /tmp/r/bench_single16 && chmod +x /tmp/r/bench_single16
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(BackwardChunkGradients|ForwardBackward)/'
mkdir -p /tmp/bj
for run in single16_1 stream32_1 single16_2 stream32_2; do
  bin=$B/bench/bench_delta_rule_cuda; [ ${run%_*} = single16 ] && bin=/tmp/r/bench_single16
  timeout 60 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
cd $B/property_tests
start=$(date +%s)
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
  for s in $(seq 21 30); do
    (RC_PARAMS="seed=$s max_success=4" timeout 200 ./$t --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_${t}_$s.log 2>&1; echo "$t seed $s rc=$?") &
  done
  wait
done > $OUT/seeds.txt
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/seeds.txt
start=$(date +%s)
timeout 300 ctest --test-dir $B/property_tests -L gpu-sanitize -R 'DeltaRuleBackward' -j 14 --timeout 290 > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$? $(( $(date +%s) - start )) s" >> $OUT/seeds.txt
timeout 90 ncu --clock-control none -k regex:chunk_gradients_kernel -c 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  --print-details all $B/bench/bench_delta_rule_cuda --benchmark_filter='BM_DeltaRuleBackwardChunkGradients/C:64/gated:0' \
  > /tmp/ncu_stage4.txt 2>&1
echo "ncu rc=$?" >> $OUT/runs.txt
tar -czf $OUT/out.tgz -C /tmp bj ncu_stage4.txt $(cd /tmp && ls suite_*.log seed_*.log)
cat $OUT/runs.txt; grep -E "rc=[1-9]|suites|sanitize" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 22"
grep -hE "tests passed|tests failed|\*\*\*Failed|Timeout" $OUT/sanitize.txt | head -10
grep -E "Duration|DRAM Throughput|Memory Throughput|Issued Warp|No Eligible|Achieved Occupancy|Stall" /tmp/ncu_stage4.txt | head -24
for r in single16_1 stream32_1 single16_2 stream32_2; do echo "== $r"; grep -E "_median" /tmp/bj/$r.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'; done
