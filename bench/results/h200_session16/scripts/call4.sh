#!/bin/bash
# Session 16, call 4, on the final build (the copy helpers shared by the scan, the output kernel and stage 4: stage 4's
# PTX unchanged, the scan's and the output kernel's differ only in the order of address additions; a test of the
# training forward off the register scan): the training step and the forward timed once; every DeltaNet GPU suite
# with CI's seed; the forward suite with seeds 21..30, the tensor-core backward and training-step properties with
# seeds 31..40; memcheck and racecheck on every DeltaNet backward device test; gradcheck.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
mkdir -p /tmp/bj /tmp/gc
timeout 100 $B/bench/bench_delta_rule_cuda --benchmark_filter='BM_DeltaRule(ForwardBackward|TrainingForward|BackwardFromSaved|Forward)/' --benchmark_out=/tmp/bj/final.json --benchmark_out_format=json > /tmp/bj/final.txt 2>&1
echo "bench rc=$?" >> $OUT/runs.txt
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
(timeout 300 ctest --test-dir $B/property_tests -L gpu-sanitize -R '(memcheck|racecheck)[.]DeltaRuleBackwardGpu' -j 6 --timeout 280 > /tmp/sanitize.log 2>&1; echo "sanitizers rc=$?") &
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 250 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?") &
done
wait
for s in $(seq 21 30); do
  (RC_PARAMS="seed=$s max_success=10" timeout 120 ./delta_rule_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_forward_$s.log 2>&1; echo "forward seed $s rc=$?") &
  (RC_PARAMS="seed=$((s + 10)) max_success=4" timeout 120 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*TensorCore*:*TrainingStep*' > /tmp/seed_backward_$((s + 10)).log 2>&1; echo "backward seed $((s + 10)) rc=$?") &
  if [ $((s % 5)) = 0 ]; then wait; fi
done
wait
} > $OUT/seeds.txt
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/runs.txt
echo "sanitizers: $(grep -E 'tests passed|tests failed' /tmp/sanitize.log)" >> $OUT/runs.txt
grep -h "OffTheRegister" /tmp/ci_delta_rule_backward_gpu_test.log >> $OUT/runs.txt
tar -czf $OUT/out.tgz -C /tmp bj gc sanitize.log $(cd /tmp && ls ci_*.log seed_*.log)
cat $OUT/gpu.txt $OUT/runs.txt; grep -E "rc=[1-9]" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of $(grep -c 'rc=' $OUT/seeds.txt)"
grep -E "_median" /tmp/bj/final.txt | grep C:64 | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'
