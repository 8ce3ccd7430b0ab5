#!/bin/bash
# Session 16, call 3, on the final build: every GPU test binary with CI's seed; the tensor-core backward and
# training-step properties with seeds 11..30 (call 1 ran 1..10), the forward, strides and bad-input suites with
# seeds 1..20; memcheck and racecheck on every DeltaNet backward device test and on the non-finite-input tests
# (which now run the training forward too); the long tests.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
cd $B/property_tests
start=$(date +%s)
{
(timeout 400 ctest --test-dir $B/property_tests -L gpu-sanitize -R '(memcheck|racecheck)[.](DeltaRuleBackwardGpu|NonFiniteInputs[.]DeltaRule)' -j 6 --timeout 380 > /tmp/sanitize.log 2>&1; echo "sanitizers rc=$?") &
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test linear_attention_gpu_test kernel_size_limits_test long_sequence_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 300 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?") &
done
wait
for s in $(seq 11 30); do
  (RC_PARAMS="seed=$s max_success=4" timeout 150 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*TensorCore*:*TrainingStep*' > /tmp/seed_backward_$s.log 2>&1; echo "backward seed $s rc=$?") &
done
wait
for s in $(seq 1 20); do
  (RC_PARAMS="seed=$s max_success=10" timeout 150 ./delta_rule_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_forward_$s.log 2>&1; echo "forward seed $s rc=$?") &
  (RC_PARAMS="seed=$s" timeout 150 ./delta_rule_strides_gpu_test --gtest_color=no > /tmp/seed_strides_$s.log 2>&1; echo "strides seed $s rc=$?") &
  (RC_PARAMS="seed=$s" timeout 150 ./bad_inputs_gpu_test --gtest_color=no > /tmp/seed_bad_$s.log 2>&1; echo "bad inputs seed $s rc=$?") &
  if [ $((s % 5)) = 0 ]; then wait; fi
done
wait
} > $OUT/seeds.txt
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/runs.txt
echo "sanitizers: $(grep -E 'tests passed|tests failed' /tmp/sanitize.log)" >> $OUT/runs.txt
timeout 110 ctest --test-dir $B/property_tests -L long -j 4 --timeout 100 > $OUT/long.txt 2>&1
echo "long rc=$?: $(grep -E 'tests passed|tests failed' $OUT/long.txt)" >> $OUT/runs.txt
grep -h "relative L2\|rel L2" /tmp/ci_delta_rule_backward_gpu_test.log > $OUT/accuracy.txt
grep -h -A1 "bf16 S0=yes seed=7" /tmp/ci_delta_rule_backward_gpu_test.log > $OUT/calibration.txt
tar -czf $OUT/out.tgz -C /tmp sanitize.log $(cd /tmp && ls ci_*.log seed_*.log)
cat $OUT/gpu.txt $OUT/runs.txt $OUT/accuracy.txt $OUT/calibration.txt; grep -E "rc=[1-9]" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of $(grep -c 'rc=' $OUT/seeds.txt)"
