#!/bin/bash
# One device call (binaries, libbenchmark and this script copied into one folder): tests, benchmark,
# sanitizers (racecheck, memcheck) on filters, CLI verify; short table. Fits a 400 s limit.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD:$LD_LIBRARY_PATH
export RC_PARAMS="seed=20261129"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/gpu.txt 2>&1
start=$(date +%s)
timeout 140 ./delta_rule_gpu_test --gtest_color=no > $OUT/tests.log 2>&1; echo "tests rc=$? ($(( $(date +%s) - start )) s)"
grep -E "^\[  FAILED|^\[  PASSED|Failure|accuracy|OUTSIDE|^\[       OK" $OUT/tests.log | cut -c1-250 | head -40
start=$(date +%s)
timeout 90 ./bench_delta_rule_cuda --benchmark_out=$OUT/bench.json --benchmark_out_format=json > $OUT/bench.txt 2>&1; echo "bench rc=$? ($(( $(date +%s) - start )) s)"
grep -E "median|rror" $OUT/bench.txt | awk '{print $1, $2, $3}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'
F='DeltaRuleGpu.RegimeChunk64*:DeltaRuleGpu.RegimeZeroGates*:DeltaRuleGpu.RegimePartialLast*:DeltaRuleGpu.Deterministic'
start=$(date +%s)
timeout 80 compute-sanitizer --tool racecheck --error-exitcode 3 ./delta_rule_gpu_test --gtest_filter="$F" > $OUT/racecheck.log 2>&1; echo "racecheck rc=$? ($(( $(date +%s) - start )) s)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUT/racecheck.log | head -5
start=$(date +%s)
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 ./delta_rule_gpu_test --gtest_filter="$F:DeltaRuleGpu.DecodeMatches*:DeltaRuleGpu.RegimeHeadDims*:DeltaRuleGpu.StagesMatchOracle*" > $OUT/memcheck.log 2>&1; echo "memcheck rc=$? ($(( $(date +%s) - start )) s)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5
timeout 20 ./deltaproof verify --impl cuda --op delta --L 100 --C 64 --dk 48 --dv 32 --seed 3 > $OUT/verify.txt 2>&1; echo "verify delta rc=$?"
timeout 20 ./deltaproof verify --impl cuda --op gated-delta --L 100 --C 64 --dk 48 --dv 32 --seed 3 >> $OUT/verify.txt 2>&1; echo "verify gated rc=$?"
tail -4 $OUT/verify.txt
cat $OUT/gpu.txt
