#!/bin/bash
# Session 15, call 1: stage 4 persistent (the next item's copies under the current one's compute).
# 2966338's binaries (before) and this build alternating twice; old and new gradcheck JSON compared; the
# backward suites with CI's seed, the resident-blocks property with seeds 1..20, backward seeds 1..10, and
# memcheck + racecheck on every DeltaNet backward device test.
set -u
mkdir -p /tmp/r /tmp/before && tar -xJf .dev-pack/run.tar.xz -C /tmp/r && tar -xJf .dev-pack/before.tar.xz -C /tmp/before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
cuobjdump --dump-resource-usage $B/bench/bench_delta_rule_cuda 2>/dev/null | grep -A1 chunk_gradients_kernel | grep -o "REG:[0-9]*\|SHARED:[0-9]*\|LOCAL:[0-9]*" | paste - - - >> $OUT/gpu.txt
F='BM_DeltaRule(BackwardChunkGradients|ForwardBackward|BackwardFromSaved|TrainingForward)/'
mkdir -p /tmp/bj /tmp/gc
for run in before_1 after_1 before_2 after_2; do
  bin=$B/bench/bench_delta_rule_cuda; [ ${run%_*} = before ] && bin=/tmp/before/bench_delta_rule_cuda_2966338
  timeout 150 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
for op in delta gated-delta; do
  for args in "" "--L 100 --C 64 --dk 48 --dv 32"; do
    tag=$op$(echo $args | tr -d ' -'); 
    timeout 60 /tmp/before/deltaproof_2966338 gradcheck --impl cuda --op $op $args --json > /tmp/gc/before_$tag.json 2>&1; b=$?
    timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op $args --json > /tmp/gc/after_$tag.json 2>&1; a=$?
    cmp -s /tmp/gc/before_$tag.json /tmp/gc/after_$tag.json && same=identical || same=DIFFERENT
    echo "gradcheck $op $args: before rc=$b after rc=$a json $same" >> $OUT/runs.txt
  done
done
cd $B/property_tests
start=$(date +%s)
{
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 300 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?") &
done
for s in $(seq 1 20); do
  (RC_PARAMS="seed=$s" timeout 200 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*ResidentBlocks*' > /tmp/seed_resident_$s.log 2>&1; echo "resident seed $s rc=$?") &
done
wait
(timeout 250 ctest --test-dir $B -L gpu-sanitize -R '(memcheck|racecheck)[.]DeltaRuleBackwardGpu' -j 6 --output-on-failure > /tmp/sanitize.log 2>&1; echo "sanitizers rc=$?") &
for s in $(seq 1 10); do
  (RC_PARAMS="seed=$s max_success=4" timeout 200 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_backward_$s.log 2>&1; echo "backward seed $s rc=$?") &
done
wait
} > $OUT/seeds.txt
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/runs.txt
echo "sanitizers: $(grep -E 'tests passed|tests failed' /tmp/sanitize.log)" >> $OUT/runs.txt
grep -h "rel L2\|relative" /tmp/ci_delta_rule_backward_gpu_test.log | head -4 > $OUT/accuracy.txt
tar -czf $OUT/out.tgz -C /tmp bj gc sanitize.log $(cd /tmp && ls ci_*.log seed_*.log)
cat $OUT/gpu.txt $OUT/runs.txt; grep -E "rc=[1-9]" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 34"
for r in before_1 after_1 before_2 after_2; do echo "== $r"; grep -E "_median" /tmp/bj/$r.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'; done
