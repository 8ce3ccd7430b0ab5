#!/bin/bash
# Session 15, call 2: 2966338's benchmark (before), call 1's kernels with the C = 16 register fix (A) and this
# build (B: shorter MMA chains in P1 and dT) alternating twice; on B the DeltaNet suites with CI's seed, the
# resident-blocks property seeds 21..40, backward seeds 11..20, gradcheck, and memcheck + racecheck on every
# DeltaNet backward device test.
set -u
mkdir -p /tmp/r /tmp/before && tar -xJf .dev-pack/run.tar.xz -C /tmp/r && tar -xJf .dev-pack/before.tar.xz -C /tmp/before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
cuobjdump --dump-resource-usage $B/bench/bench_delta_rule_cuda 2>/dev/null | grep -A1 chunk_gradients_kernel | grep -o "REG:[0-9]*\|SHARED:[0-9]*\|LOCAL:[0-9]*" | paste - - - >> $OUT/gpu.txt
F='BM_DeltaRule(BackwardChunkGradients|ForwardBackward)/'
mkdir -p /tmp/bj /tmp/gc
for run in before_1 A_1 B_1 before_2 A_2 B_2; do
  case ${run%_*} in before) bin=/tmp/before/bench_delta_rule_cuda_2966338;; A) bin=/tmp/before/bench_A;; B) bin=$B/bench/bench_delta_rule_cuda;; esac
  timeout 100 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
for op in delta gated-delta; do
  for args in "" "--L 100 --C 64 --dk 48 --dv 32"; do
    tag=$op$(echo $args | tr -d ' -')
    timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op $args --json > /tmp/gc/B_$tag.json 2>&1
    echo "gradcheck $op $args: rc=$?" >> $OUT/runs.txt
  done
done
cd $B/property_tests
start=$(date +%s)
{
(timeout 300 ctest --test-dir $B/property_tests -L gpu-sanitize -R '(memcheck|racecheck)[.]DeltaRuleBackwardGpu' -j 6 --timeout 280 > /tmp/sanitize.log 2>&1; echo "sanitizers rc=$?") &
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 300 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?") &
done
for s in $(seq 21 40); do
  (RC_PARAMS="seed=$s" timeout 200 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*ResidentBlocks*' > /tmp/seed_resident_$s.log 2>&1; echo "resident seed $s rc=$?") &
done
wait
for s in $(seq 11 20); do
  (RC_PARAMS="seed=$s max_success=4" timeout 150 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_backward_$s.log 2>&1; echo "backward seed $s rc=$?") &
done
wait
} > $OUT/seeds.txt
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/runs.txt
echo "sanitizers: $(grep -E 'tests passed|tests failed' /tmp/sanitize.log)" >> $OUT/runs.txt
grep -h "relative L2" /tmp/ci_delta_rule_backward_gpu_test.log > $OUT/accuracy.txt
tar -czf $OUT/out.tgz -C /tmp bj gc sanitize.log $(cd /tmp && ls ci_*.log seed_*.log)
cat $OUT/gpu.txt $OUT/runs.txt $OUT/accuracy.txt; grep -E "rc=[1-9]" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 35"
for r in before_1 A_1 B_1 before_2 A_2 B_2; do echo "== $r"; grep -E "_median" /tmp/bj/$r.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'; done
