#!/bin/bash
# Session 13, call 5: where stage 4's time goes at C = 64 (this build against three timing ablations made with
# scripts/stage4_ablation.patch: 1 = no P2, 2 = loads and P1 only, 3 = loads, P1 and P2), alternating twice; then on
# this build (the final kernels): every GPU suite with CI's seed, seeds 21..30 of the forward suite beside the long
# runs, and the forward and strides device tests under memcheck, racecheck, synccheck and initcheck.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
for a in 1 2 3; do xz -dc .dev-pack/bench_a$a.xz > /tmp/r/bench_a$a && chmod +x /tmp/r/bench_a$a; done
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
mkdir -p /tmp/bj
for run in full_1 a1_1 a2_1 a3_1 full_2 a1_2 a2_2 a3_2; do
  bin=$B/bench/bench_delta_rule_cuda; [ ${run%_*} != full ] && bin=/tmp/r/bench_${run%_*}
  timeout 40 $bin --benchmark_filter='BM_DeltaRuleBackwardChunkGradients/C:64' --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
cd $B/property_tests
start=$(date +%s)
for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test linear_attention_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 150 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
wait
echo "suites $(( $(date +%s) - start )) s" >> $OUT/suites.txt
start=$(date +%s)
(timeout 120 ctest --test-dir $B/property_tests -L long -j 4 --timeout 110 > $OUT/long.txt 2>&1; echo "long rc=$?" >> $OUT/suites.txt) &
for s in $(seq 21 30); do
  (RC_PARAMS="seed=$s max_success=4" timeout 120 ./delta_rule_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_$s.log 2>&1; echo "forward seed $s rc=$?") &
done > $OUT/seeds.txt
wait
echo "long and seeds $(( $(date +%s) - start )) s" >> $OUT/suites.txt
start=$(date +%s)
timeout 170 ctest --test-dir $B/property_tests -L gpu-sanitize -R 'DeltaRuleGpu|DeltaRuleStridesGpu' -j 14 --timeout 160 > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$? $(( $(date +%s) - start )) s" >> $OUT/suites.txt
tar -czf $OUT/out.tgz -C /tmp bj $(cd /tmp && ls suite_*.log seed_*.log)
cat $OUT/runs.txt $OUT/suites.txt; echo "seeds rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 10"
grep -hE "^\[  FAILED" /tmp/suite_*.log /tmp/seed_*.log | sort | uniq -c | head
grep -hE "tests passed|tests failed|\*\*\*Failed|Timeout" $OUT/sanitize.txt $OUT/long.txt | head
for r in full_1 a1_1 a2_1 a3_1 full_2 a1_2 a2_2 a3_2; do echo "== $r"; grep -E "_median" /tmp/bj/$r.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'; done
