#!/bin/bash
# Session 15, call 3: call 2's B and this build (C: gated P6 in warp 0's shuffles, K later without gates)
# alternating twice; C's benchmark in full (the report's JSON); on C the DeltaNet suites with CI's seed, the
# resident-blocks property seeds 41..60, backward seeds 21..30, gradcheck, memcheck + racecheck on every DeltaNet
# backward device test.
set -u
mkdir -p /tmp/r /tmp/before && tar -xJf .dev-pack/run.tar.xz -C /tmp/r && tar -xJf .dev-pack/before.tar.xz -C /tmp/before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
cuobjdump --dump-resource-usage $B/bench/bench_delta_rule_cuda 2>/dev/null | grep -A1 chunk_gradients_kernel | grep -o "REG:[0-9]*\|SHARED:[0-9]*\|LOCAL:[0-9]*" | paste - - - >> $OUT/gpu.txt
F='BM_DeltaRule(BackwardChunkGradients|ForwardBackward)/'
mkdir -p /tmp/bj /tmp/gc
for run in B_1 C_1 B_2 C_2; do
  bin=$B/bench/bench_delta_rule_cuda; [ ${run%_*} = B ] && bin=/tmp/before/bench_B
  timeout 100 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
start=$(date +%s)
timeout 240 $B/bench/bench_delta_rule_cuda --benchmark_out=/tmp/bj/full.json --benchmark_out_format=json > /tmp/bj/full.txt 2>&1
echo "full rc=$? $(( $(date +%s) - start )) s" >> $OUT/runs.txt
for op in delta gated-delta; do
  for args in "" "--L 100 --C 64 --dk 48 --dv 32"; do
    tag=$op$(echo $args | tr -d ' -')
    timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op $args --json > /tmp/gc/C_$tag.json 2>&1
    echo "gradcheck $op $args: rc=$?" >> $OUT/runs.txt
  done
done
cd $B/property_tests
start=$(date +%s)
{
(timeout 280 ctest --test-dir $B/property_tests -L gpu-sanitize -R '(memcheck|racecheck)[.]DeltaRuleBackwardGpu' -j 6 --timeout 270 > /tmp/sanitize.log 2>&1; echo "sanitizers rc=$?") &
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 280 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?") &
done
for s in $(seq 41 60); do
  (RC_PARAMS="seed=$s" timeout 200 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*ResidentBlocks*' > /tmp/seed_resident_$s.log 2>&1; echo "resident seed $s rc=$?") &
done
wait
for s in $(seq 21 30); do
  (RC_PARAMS="seed=$s max_success=4" timeout 120 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_backward_$s.log 2>&1; echo "backward seed $s rc=$?") &
done
wait
} > $OUT/seeds.txt
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/runs.txt
echo "sanitizers: $(grep -E 'tests passed|tests failed' /tmp/sanitize.log)" >> $OUT/runs.txt
grep -h "relative L2" /tmp/ci_delta_rule_backward_gpu_test.log > $OUT/accuracy.txt
cp /tmp/bj/full.json $OUT/full.json
tar -czf $OUT/out.tgz -C /tmp bj gc sanitize.log $(cd /tmp && ls ci_*.log seed_*.log)
cat $OUT/gpu.txt $OUT/runs.txt $OUT/accuracy.txt; grep -E "rc=[1-9]" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 35"
for r in B_1 C_1 B_2 C_2; do echo "== $r"; grep -E "_median" /tmp/bj/$r.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'; done
echo "== full (C = 64)"; grep -E "_median" /tmp/bj/full.txt | grep -E "C:64|Decode" | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'
