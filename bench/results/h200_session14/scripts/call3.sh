#!/bin/bash
# Session 14, call 3, on the final build (call 1's kernels: call 2's scan change reverted): the six GPU suites with
# CI's seed beside the long tests; seeds 41..60 of the backward suite and seeds 1..20 of the training-step tests;
# every DeltaNet device test (backward, forward, strides) under memcheck, racecheck, synccheck and initcheck;
# `deltaproof gradcheck --impl cuda` on the default case and on --L 100 --C 64 --dk 48 --dv 32.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
cd $B/property_tests
start=$(date +%s)
{
(timeout 150 ctest --test-dir $B/property_tests -L long -j 3 --timeout 140 > $OUT/long.txt 2>&1; echo "long rc=$?") &
for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test linear_attention_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done
wait
for s in $(seq 41 60); do
  (RC_PARAMS="seed=$s max_success=4" timeout 200 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_$s.log 2>&1; echo "backward seed $s rc=$?") &
done
(for s in $(seq 1 20); do
   RC_PARAMS="seed=$s" timeout 60 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*TrainingStep*:*SavedBuffer*' > /tmp/training_$s.log 2>&1
   echo "training seed $s rc=$?"
 done) &
wait
} > $OUT/suites.txt
echo "suites, long and seeds $(( $(date +%s) - start )) s" >> $OUT/runs.txt
start=$(date +%s)
timeout 270 ctest --test-dir $B/property_tests -L gpu-sanitize -R 'DeltaRuleBackward|DeltaRuleGpu|DeltaRuleStridesGpu' -j 14 --timeout 260 > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$? $(( $(date +%s) - start )) s" >> $OUT/runs.txt
for op in delta gated-delta; do
  timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op > /tmp/cli_$op.txt 2>&1; echo "gradcheck $op default rc=$?"
  timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op --L 100 --C 64 --dk 48 --dv 32 >> /tmp/cli_$op.txt 2>&1
  echo "gradcheck $op L100 rc=$?"
done >> $OUT/runs.txt
cat /tmp/cli_delta.txt /tmp/cli_gated-delta.txt > $OUT/gradcheck_cli.txt
tar -czf $OUT/out.tgz -C /tmp $(cd /tmp && ls suite_*.log seed_*.log training_*.log)
cat $OUT/runs.txt; grep -E "rc=[1-9]" $OUT/suites.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/suites.txt) of 47"
grep -h "relative L2" /tmp/suite_delta_rule_backward_gpu_test.log /tmp/suite_delta_rule_gpu_test.log
grep -hE "tests passed|tests failed|\*\*\*Failed|Timeout" $OUT/sanitize.txt $OUT/long.txt | head
