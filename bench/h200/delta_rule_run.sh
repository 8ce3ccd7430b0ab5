#!/bin/bash
# One device call: tests, sanitizers, benchmarks; short table last.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD:$LD_LIBRARY_PATH
export RC_PARAMS="seed=20261129"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
MODE=${1:-full}
if [ "$MODE" != bench ]; then
  start=$(date +%s)
  timeout 200 ./delta_rule_gpu_test --gtest_color=no > $OUT/tests.log 2>&1; echo "tests rc=$? ($(( $(date +%s) - start )) s)"
  grep -E "^\[  FAILED|^\[  PASSED|Failure|accuracy|caught|max err/bound|rel L2|unnormalized|key_shift|OUTSIDE|^\[       OK" $OUT/tests.log | cut -c1-300 | head -60
fi
if [ "$MODE" = full ]; then
  F='DeltaRuleGpu.RegimeChunk64*:DeltaRuleGpu.RegimeZeroGates*:DeltaRuleGpu.RegimePartialLast*:DeltaRuleGpu.Deterministic'
  start=$(date +%s)
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 ./delta_rule_gpu_test --gtest_filter="$F:DeltaRuleGpu.DecodeMatches*:DeltaRuleGpu.RegimeHeadDims*" > $OUT/memcheck.log 2>&1; echo "memcheck rc=$? ($(( $(date +%s) - start )) s)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5
  start=$(date +%s)
  timeout 120 compute-sanitizer --tool racecheck --error-exitcode 3 ./delta_rule_gpu_test --gtest_filter="$F" > $OUT/racecheck.log 2>&1; echo "racecheck rc=$? ($(( $(date +%s) - start )) s)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUT/racecheck.log | head -5
fi
timeout 150 ./bench_delta_rule_cuda --benchmark_out=$OUT/bench.json --benchmark_out_format=json > $OUT/bench.txt 2>&1; echo "bench rc=$?"
grep -E "median|rror" $OUT/bench.txt | awk '{print $1, $2, $3}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'
cat $OUT/gpu.txt
