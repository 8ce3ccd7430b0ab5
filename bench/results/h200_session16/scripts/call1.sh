#!/bin/bash
# Session 16, call 1: 390ade2's benchmark (before) and this build (after: the state pass in the training forward,
# its output by chunk_output_kernel) alternating twice on the training step and its halves; on this build the
# DeltaNet suites with CI's seed, backward seeds 1..10, gradcheck, and memcheck + racecheck on every DeltaNet
# backward device test.
set -u
mkdir -p /tmp/r /tmp/before && tar -xJf .dev-pack/run.tar.xz -C /tmp/r && tar -xJf .dev-pack/before.tar.xz -C /tmp/before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
cuobjdump --dump-resource-usage $B/bench/bench_delta_rule_cuda 2>/dev/null | grep -A1 chunk_output_kernel | grep -o "REG:[0-9]*\|SHARED:[0-9]*\|LOCAL:[0-9]*" | paste - - - >> $OUT/gpu.txt
F='BM_DeltaRule(ForwardBackward|TrainingForward|BackwardFromSaved|Forward)/'
mkdir -p /tmp/bj /tmp/gc
for run in before_1 after_1 before_2 after_2; do
  case ${run%_*} in before) bin=/tmp/before/bench_delta_rule_cuda_390ade2;; after) bin=$B/bench/bench_delta_rule_cuda;; esac
  timeout 120 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
for op in delta gated-delta; do
  for args in "" "--L 100 --C 64 --dk 48 --dv 32"; do
    tag=$op$(echo $args | tr -d ' -')
    timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op $args --json > /tmp/gc/$tag.json 2>&1
    echo "gradcheck $op $args: rc=$?" >> $OUT/runs.txt
  done
done
cd $B/property_tests
start=$(date +%s)
{
(timeout 330 ctest --test-dir $B/property_tests -L gpu-sanitize -R '(memcheck|racecheck)[.]DeltaRuleBackwardGpu' -j 6 --timeout 300 > /tmp/sanitize.log 2>&1; echo "sanitizers rc=$?") &
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 300 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?") &
done
wait
for s in $(seq 1 10); do
  (RC_PARAMS="seed=$s max_success=4" timeout 150 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*TensorCore*:*TrainingStep*' > /tmp/seed_backward_$s.log 2>&1; echo "backward seed $s rc=$?") &
done
wait
} > $OUT/seeds.txt
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/runs.txt
echo "sanitizers: $(grep -E 'tests passed|tests failed' /tmp/sanitize.log)" >> $OUT/runs.txt
grep -h "relative L2\|rel L2" /tmp/ci_delta_rule_backward_gpu_test.log /tmp/ci_delta_rule_gpu_test.log > $OUT/accuracy.txt
tar -czf $OUT/out.tgz -C /tmp bj gc sanitize.log $(cd /tmp && ls ci_*.log seed_*.log)
cat $OUT/gpu.txt $OUT/runs.txt $OUT/accuracy.txt; cat $OUT/seeds.txt | grep -E "rc=[1-9]"; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 15"
for r in before_1 after_1 before_2 after_2; do echo "== $r"; grep -E "_median" /tmp/bj/$r.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'; done
