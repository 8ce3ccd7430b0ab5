#!/bin/bash
# Session 13, call 4: on the final build (the end-to-end allowance for cancelling gradients included): the backward,
# strides and bad-input suites with CI's seed; seeds 21..40 of the backward suite (28 failed in call 2) and 31..40 of
# the strides suite.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
cd $B/property_tests
start=$(date +%s)
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
wait
for s in $(seq 21 40); do
  (RC_PARAMS="seed=$s max_success=4" timeout 200 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_delta_rule_backward_gpu_test_$s.log 2>&1; echo "backward seed $s rc=$?") &
  [ $((s % 10)) = 0 ] && wait
done > $OUT/seeds.txt
for s in $(seq 31 40); do
  (RC_PARAMS="seed=$s max_success=4" timeout 200 ./delta_rule_strides_gpu_test --gtest_color=no > /tmp/seed_delta_rule_strides_gpu_test_$s.log 2>&1; echo "strides seed $s rc=$?") &
done >> $OUT/seeds.txt
wait
echo "all $(( $(date +%s) - start )) s" >> $OUT/seeds.txt
tar -czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls suite_*.log seed_*.log)
cat $OUT/suites.txt; grep -E "rc=[1-9]|all" $OUT/seeds.txt; echo "seeds rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 30"
grep -hE "^\[  FAILED|OUTSIDE" /tmp/suite_*.log /tmp/seed_*.log | sort | uniq -c | head
