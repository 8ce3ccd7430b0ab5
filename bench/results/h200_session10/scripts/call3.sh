#!/bin/bash
# Session 10, call 3 (the tree's kernels, call 1's): the forward suite under memcheck, racecheck and initcheck,
# beside seeds 1..10 of the backward and strides suites (call 1 ran seeds 1..20 of the forward suite).
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE  # the ctest files' absolute paths
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
cd $B/property_tests
start=$(date +%s)
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test; do
  for s in $(seq 1 10); do
    (RC_PARAMS="seed=$s max_success=4" timeout 200 ./$t --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_${t}_$s.log 2>&1; echo "$t seed $s rc=$?") &
  done
done > $OUT/seeds.txt
timeout 230 ctest --test-dir $B/property_tests -L gpu-sanitize -R 'sanitize\.(memcheck|racecheck|initcheck)\.DeltaRuleGpu\.' \
  -j 8 --timeout 220 > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$? $(( $(date +%s) - start )) s" > $OUT/summary.txt
wait
echo "seeds $(grep -c 'rc=0' $OUT/seeds.txt) of 20 rc=0, $(( $(date +%s) - start )) s" >> $OUT/summary.txt
tar -czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls seed_*.log)
cat $OUT/summary.txt; grep -v "rc=0" $OUT/seeds.txt
grep -hE "tests passed|tests failed|Failed|\*\*\*|Timeout" $OUT/sanitize.txt | head -20
