#!/bin/bash
# Session 14, call 5: the final test binary (the training-step tests share one forward_shape helper now): the
# training-step and saved-buffer tests with seeds 21..40, and under memcheck and racecheck.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
cd $B/property_tests
for s in $(seq 21 40); do
  RC_PARAMS="seed=$s" timeout 60 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*TrainingStep*:*SavedBuffer*' > /tmp/training_$s.log 2>&1
  echo "training seed $s rc=$?"
done > $OUT/runs.txt
for tool in memcheck racecheck; do
  RC_PARAMS="seed=20261129 max_success=3" timeout 120 compute-sanitizer --tool $tool --error-exitcode 99 ./delta_rule_backward_gpu_test \
    --gtest_filter='*TrainingStep*:*SavedBuffer*' > /tmp/sanitize_$tool.log 2>&1
  echo "$tool rc=$?" >> $OUT/runs.txt
done
tar -czf $OUT/out.tgz -C /tmp $(cd /tmp && ls training_*.log sanitize_*.log)
grep -E "rc=[1-9]|check" $OUT/runs.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/runs.txt) of 22"
