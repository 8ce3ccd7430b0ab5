#!/bin/bash
# Session 17, call 5, on the final build (round 1's stage 4 and scans, the prepare's copies and zeroing): 40c960a's
# benchmark and this one alternating twice on the forward and the training step; gradcheck JSON of both builds
# compared byte for byte; bench_delta_rule_cuda in full (the report's JSON); every GPU test binary with CI's seed;
# the tensor-core backward and training-step properties, the forward, strides and bad-input suites with seeds 1..12;
# memcheck and racecheck on every DeltaNet forward, strides and backward device test; the long tests.
set -u
mkdir -p /tmp/r /tmp/before && tar -xJf .dev-pack/run.tar.xz -C /tmp/r && tar -xJf .dev-pack/before.tar.xz -C /tmp/before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(ForwardBackward|TrainingForward|Forward|WyPrepare)/C:64/'
mkdir -p /tmp/bj /tmp/gc
start=$(date +%s)
for run in before_1 after_1 before_2 after_2; do
  case ${run%_*} in before) bin=/tmp/before/bench_delta_rule_cuda_40c960a;; after) bin=$B/bench/bench_delta_rule_cuda;; esac
  timeout 60 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
echo "timing $(( $(date +%s) - start )) s" >> $OUT/runs.txt
for which in before after; do
  case $which in before) tool=/tmp/before/deltaproof_40c960a;; after) tool=$B/tools/deltaproof;; esac
  for op in delta gated-delta; do
    for args in "" "--L 100 --C 64 --dk 48 --dv 32" "--L 300 --C 32 --dk 128 --dv 96"; do
      tag=$op$(echo $args | tr -d ' -')
      timeout 40 $tool gradcheck --impl cuda --op $op $args --json > /tmp/gc/${which}_$tag.json 2>&1
      echo "gradcheck $which $op $args: rc=$?" >> $OUT/runs.txt
    done
  done
done
for f in /tmp/gc/after_*.json; do b=/tmp/gc/before_${f#/tmp/gc/after_}; cmp -s $f $b && echo "identical ${f#/tmp/gc/after_}" || echo "DIFFER ${f#/tmp/gc/after_}"; done >> $OUT/runs.txt
start=$(date +%s)
timeout 110 $B/bench/bench_delta_rule_cuda --benchmark_out=/tmp/bj/full.json --benchmark_out_format=json > /tmp/bj/full.txt 2>&1
echo "full rc=$? $(( $(date +%s) - start )) s" >> $OUT/runs.txt
cp /tmp/bj/full.json $OUT/full.json
cd $B/property_tests
start=$(date +%s)
{
(timeout 300 ctest --test-dir $B/property_tests -L gpu-sanitize -R '(memcheck|racecheck)[.](DeltaRuleBackwardGpu|DeltaRuleGpu|DeltaRuleStridesGpu)' -j 6 --timeout 290 > /tmp/sanitize.log 2>&1; echo "sanitizers rc=$?") &
sanitizers=$!
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test linear_attention_gpu_test kernel_size_limits_test long_sequence_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?") &
done
for job in $(jobs -p); do [ "$job" = "$sanitizers" ] || wait $job; done
echo "CI seed $(( $(date +%s) - start )) s"
for s in $(seq 1 12); do
  (RC_PARAMS="seed=$s max_success=4" timeout 100 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='*TensorCore*:*TrainingStep*' > /tmp/seed_backward_$s.log 2>&1; echo "backward seed $s rc=$?") &
  (RC_PARAMS="seed=$s max_success=10" timeout 100 ./delta_rule_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_forward_$s.log 2>&1; echo "forward seed $s rc=$?") &
  (RC_PARAMS="seed=$s" timeout 100 ./delta_rule_strides_gpu_test --gtest_color=no > /tmp/seed_strides_$s.log 2>&1; echo "strides seed $s rc=$?") &
  (RC_PARAMS="seed=$s" timeout 100 ./bad_inputs_gpu_test --gtest_color=no > /tmp/seed_bad_$s.log 2>&1; echo "bad inputs seed $s rc=$?") &
  if [ $((s % 4)) = 0 ]; then for job in $(jobs -p); do [ "$job" = "$sanitizers" ] || wait $job; done; fi
done
wait
} > $OUT/seeds.txt
echo "verification $(( $(date +%s) - start )) s; sanitizers: $(grep -E 'tests passed|tests failed' /tmp/sanitize.log)" >> $OUT/runs.txt
grep -h "relative L2\|rel L2" /tmp/ci_delta_rule_backward_gpu_test.log > $OUT/accuracy.txt
grep -h -A1 "bf16 S0=yes seed=7" /tmp/ci_delta_rule_backward_gpu_test.log > $OUT/calibration.txt
tar -czf $OUT/out.tgz -C /tmp bj gc sanitize.log $(cd /tmp && ls ci_*.log seed_*.log)
cat $OUT/gpu.txt $OUT/runs.txt $OUT/accuracy.txt; grep -E "rc=[1-9]" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of $(grep -c 'rc=' $OUT/seeds.txt)"
for run in before_1 after_1 before_2 after_2; do echo "== $run"; grep -E "_median" /tmp/bj/$run.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||' | paste -sd' '; done
echo "== full (C = 64)"; grep -E "_median" /tmp/bj/full.txt | grep -E "C:64" | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||' | paste -sd' '
