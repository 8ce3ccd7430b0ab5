#!/bin/bash
# Session 18, call 5, on the final build (09721eb's kernels): bench_delta_rule_cuda in full (the report's JSON); the long
# tests alone; every GPU test binary with CI's seed while memcheck and racecheck run on every DeltaNet forward, strides
# and backward device test; then the tensor-core backward and training-step properties, the forward, strides and
# bad-input suites with seeds 1..20, four seeds at a time, no new batch started past 500 s (the seeds that ran are
# listed); the accuracy lines and the stage calibration.
set -u
T0=$(date +%s)
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
mkdir -p /tmp/bj
start=$(date +%s)
timeout 110 $B/bench/bench_delta_rule_cuda --benchmark_out=/tmp/bj/full.json --benchmark_out_format=json > /tmp/bj/full.txt 2>&1
echo "full rc=$? $(( $(date +%s) - start )) s" >> $OUT/runs.txt
cp /tmp/bj/full.json $OUT/full.json
start=$(date +%s)
timeout 150 ctest --test-dir $B/property_tests -L long -j 4 --timeout 140 > $OUT/long.txt 2>&1
echo "long rc=$? $(( $(date +%s) - start )) s: $(grep -E 'tests passed|tests failed' $OUT/long.txt)" >> $OUT/runs.txt
cd $B/property_tests
start=$(date +%s)
{
(timeout 300 ctest --test-dir $B/property_tests -L gpu-sanitize -R '(memcheck|racecheck)[.](DeltaRuleBackwardGpu|DeltaRuleGpu|DeltaRuleStridesGpu)' -j 6 --timeout 290 > /tmp/sanitize.log 2>&1; echo "sanitizers rc=$?") &
sanitizers=$!
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test linear_attention_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?") &
done
for job in $(jobs -p); do [ "$job" = "$sanitizers" ] || wait $job; done
echo "CI seed $(( $(date +%s) - start )) s"
for s in $(seq 1 20); do
  (RC_PARAMS="seed=$s max_success=4" timeout 100 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*TensorCore*:*TrainingStep*' > /tmp/seed_backward_$s.log 2>&1; echo "backward seed $s rc=$?") &
  (RC_PARAMS="seed=$s max_success=10" timeout 100 ./delta_rule_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_forward_$s.log 2>&1; echo "forward seed $s rc=$?") &
  (RC_PARAMS="seed=$s" timeout 100 ./delta_rule_strides_gpu_test --gtest_color=no > /tmp/seed_strides_$s.log 2>&1; echo "strides seed $s rc=$?") &
  (RC_PARAMS="seed=$s" timeout 100 ./bad_inputs_gpu_test --gtest_color=no > /tmp/seed_bad_$s.log 2>&1; echo "bad inputs seed $s rc=$?") &
  if [ $((s % 4)) = 0 ]; then
    for job in $(jobs -p); do [ "$job" = "$sanitizers" ] || wait $job; done
    if [ $(( $(date +%s) - T0 )) -gt 500 ]; then echo "stopped after seed $s: past 500 s"; break; fi
  fi
done
wait
} > $OUT/seeds.txt
echo "verification $(( $(date +%s) - start )) s; sanitizers: $(grep -E 'tests passed|tests failed' /tmp/sanitize.log)" >> $OUT/runs.txt
grep -h "relative L2\|rel L2" /tmp/ci_delta_rule_backward_gpu_test.log > $OUT/accuracy.txt
grep -h -A1 "bf16 S0=yes seed=7" /tmp/ci_delta_rule_backward_gpu_test.log > $OUT/calibration.txt
tar -czf $OUT/out.tgz -C /tmp bj sanitize.log $(cd /tmp && ls ci_*.log seed_*.log)
cat $OUT/gpu.txt $OUT/runs.txt $OUT/accuracy.txt; grep -E "rc=[1-9]|stopped" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of $(grep -c 'rc=' $OUT/seeds.txt)"
echo "== full (C = 64)"; grep -E "_median" /tmp/bj/full.txt | grep -E "C:64" | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||; s|/C:64/gated:| g|' | paste -sd' '
echo "total $(( $(date +%s) - T0 )) s"
