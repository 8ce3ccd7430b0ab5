#!/bin/bash
# Session 14, call 6, on the final code (9a3c34d: shared test helpers, one saved-size function): the backward, forward,
# strides and bad-input suites with CI's seed; backward suite seeds 61..70; training-step tests seeds 41..50; the
# backward's argument and training-step device tests under memcheck and racecheck.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
cd $B/property_tests
start=$(date +%s)
{
for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 130 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done
for s in $(seq 61 70); do
  (RC_PARAMS="seed=$s max_success=4" timeout 130 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_$s.log 2>&1; echo "backward seed $s rc=$?") &
done
(for s in $(seq 41 50); do
   RC_PARAMS="seed=$s" timeout 20 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*TrainingStep*:*SavedBuffer*' > /tmp/training_$s.log 2>&1
   echo "training seed $s rc=$?"
 done) &
wait
for tool in memcheck racecheck; do
  RC_PARAMS="seed=20261129 max_success=3" timeout 40 compute-sanitizer --tool $tool --error-exitcode 99 ./delta_rule_backward_gpu_test \
    --gtest_filter='*TrainingStep*:*SavedBuffer*:*InvalidPointers*' > /tmp/sanitize_$tool.log 2>&1
  echo "$tool rc=$?"
done
} > $OUT/runs.txt
echo "all $(( $(date +%s) - start )) s" >> $OUT/runs.txt
tar -czf $OUT/out.tgz -C /tmp $(cd /tmp && ls suite_*.log seed_*.log training_*.log sanitize_*.log)
grep -E "rc=[1-9]|all " $OUT/runs.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/runs.txt) of 26"
grep -h "relative L2" /tmp/suite_delta_rule_backward_gpu_test.log
