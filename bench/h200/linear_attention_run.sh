#!/bin/bash
# Usage: linear_attention_run.sh [tests] [memcheck] [racecheck] [bench] [cli]
# Binaries (and libbenchmark.so.1debian) sit next to this script; logs go to $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD:$LD_LIBRARY_PATH
export PATH=$PATH:/usr/local/cuda/bin
SHARDS=14
suite() {  # $1: log name, $2: cases, $3: gtest filter, $4: prefix command
  local start=$(date +%s)
  for i in $(seq 0 $((SHARDS-1))); do
    GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i GTEST_FILTER="$3" RC_PARAMS="max_success=$2 seed=1" \
      timeout ${TEST_TIMEOUT:-200} $4 ./linear_attention_gpu_test > $OUT/$1_$i.log 2>&1 &
  done
  wait
  cat $OUT/$1_*.log > $OUT/$1.log; rm $OUT/$1_*.log
  echo "== $1: $(( $(date +%s) - start )) s; OK $(grep -c 'OK \]' $OUT/$1.log), FAILED $(grep -c 'FAILED  \]' $OUT/$1.log), skipped $(grep -c 'SKIPPED \]' $OUT/$1.log)"
}
for step in "$@"; do case $step in
  tests) suite tests ${CASES:-30} "*" ""
         grep -E "FAILED  \]|  C=|bf16 rounding|Falsifiable|outside|exception|Failure" $OUT/tests.log | head -40 ;;
  # The planted-bug test runs every property several times over; under a sanitizer it gets
  # its own shard set with one case per property.
  memcheck|racecheck)
         suite $step 3 "-*PlantedBugs*" "compute-sanitizer --tool $step --error-exitcode 9"
         SHARDS=1 suite ${step}_planted 1 "*PlantedBugs*" "compute-sanitizer --tool $step --error-exitcode 9"
         grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" $OUT/$step.log $OUT/${step}_planted.log | sort | uniq -c ;;
  bench) ./bench_linear_attention_cuda --benchmark_out=$OUT/bench.json --benchmark_out_format=json 2>&1 | grep -E "median" | awk '{print $1, $2, $3}' ;;
  cli) for args in "verify --op linear --impl cuda" "verify --op linear --impl cuda --L 200 --C 16 --dk 40 --dv 24 --seed 5" \
                   "gradcheck --op linear --impl cuda --C 64" "gradcheck --op linear --impl cuda --C 16 --L 50 --dk 9 --dv 13"; do
         echo "== deltaproof $args"; ./deltaproof $args 2>&1 | tail -25; echo "exit ${PIPESTATUS[0]}"
       done > $OUT/cli.log
       grep -E "^== |exit|AGREE|DISAGREE|PASS|FAIL" $OUT/cli.log ;;
esac; done
