#!/bin/bash
# Session 18, call 7: the final commit's build (5368f4b: the launch sites reshaped after call 5's build, no kernel
# changed) through the DeltaNet device suites with CI's seed and gradcheck on both ops (the default case and
# --L 100 --C 64 --dk 48 --dv 32).
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
start=$(date +%s)
cd $B/property_tests
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 150 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$? $(grep -E '^\[  (PASSED|FAILED) ' /tmp/ci_$t.log | head -1)" >> $OUT/runs.txt) &
done
for op in delta gated-delta; do
  for args in "" "--L 100 --C 64 --dk 48 --dv 32"; do
    (timeout 120 $B/tools/deltaproof gradcheck --impl cuda --op $op $args --json > /tmp/gc_$op$(echo $args | tr -d ' -').json 2>&1; echo "gradcheck $op $args: rc=$?" >> $OUT/runs.txt) &
  done
done
wait
echo "total $(( $(date +%s) - start )) s" >> $OUT/runs.txt
tar -czf $OUT/out.tgz -C /tmp $(cd /tmp && ls ci_*.log gc_*.json)
cat $OUT/runs.txt
