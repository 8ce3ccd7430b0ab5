#!/bin/bash
# Session 14, call 1: the training forward (ForwardParams::saved) and the backward reading it.
# bench_delta_rule_cuda in full (the JSON), then its four forward + backward families once more; the six GPU suites
# with CI's seed; the new training-step tests with seeds 1..20; every backward device test under the four sanitizers.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
mkdir -p /tmp/bj
timeout 200 $B/bench/bench_delta_rule_cuda --benchmark_out=/tmp/bj/full.json --benchmark_out_format=json > /tmp/bj/full.txt 2>&1
echo "bench full rc=$?" >> $OUT/runs.txt
cd $B/property_tests
start=$(date +%s)
{
for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test linear_attention_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 240 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done
(for s in $(seq 1 20); do
   RC_PARAMS="seed=$s" timeout 60 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*TrainingStep*:*SavedBuffer*' > /tmp/training_$s.log 2>&1
   echo "training seed $s rc=$?"
 done) &
wait
} > $OUT/seeds.txt
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/runs.txt
start=$(date +%s)
timeout 280 ctest --test-dir $B/property_tests -L gpu-sanitize -R 'DeltaRuleBackward' -j 14 --timeout 270 > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$? $(( $(date +%s) - start )) s" >> $OUT/runs.txt
timeout 80 $B/bench/bench_delta_rule_cuda --benchmark_filter='BM_DeltaRule(ForwardBackward|ForwardBackwardRecomputing|TrainingForward|BackwardFromSaved)/' \
  --benchmark_out=/tmp/bj/repeat.json --benchmark_out_format=json > /tmp/bj/repeat.txt 2>&1
echo "bench repeat rc=$?" >> $OUT/runs.txt
tar -czf $OUT/out.tgz -C /tmp bj $(cd /tmp && ls suite_*.log training_*.log)
cat $OUT/runs.txt; grep -E "rc=[1-9]" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 26"
grep -hE "tests passed|tests failed|\*\*\*Failed|Timeout" $OUT/sanitize.txt | head -10
for f in full repeat; do echo "== $f"; grep -E "_median" /tmp/bj/$f.txt | grep -E "C:64" | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'; done
