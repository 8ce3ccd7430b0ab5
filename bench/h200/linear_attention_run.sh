#!/bin/bash
# Usage: run.sh [tests] [sass] [memcheck] [racecheck] [bench]
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD:$LD_LIBRARY_PATH
export PATH=$PATH:/usr/local/cuda/bin
SHARDS=14
suite() {  # $1: log name, $2: cases, $3: prefix command
  local start=$(date +%s)
  for i in $(seq 0 $((SHARDS-1))); do
    GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i RC_PARAMS="max_success=$2 seed=1" timeout ${TEST_TIMEOUT:-200} $3 ./linear_attention_gpu_test > $OUT/$1_$i.log 2>&1 &
  done
  wait
  cat $OUT/$1_*.log > $OUT/$1.log; rm $OUT/$1_*.log
  echo "== $1: $(( $(date +%s) - start )) s; OK $(grep -c 'OK \]' $OUT/$1.log), FAILED $(grep -c 'FAILED  \]' $OUT/$1.log), skipped $(grep -c 'SKIPPED \]' $OUT/$1.log)"
}
for step in "$@"; do case $step in
  tests) suite tests ${CASES:-30} ""
         grep -E "FAILED  \]|  C=|bf16 rounding|Falsifiable|outside|exception|Failure" $OUT/tests.log | head -40 ;;
  sass) echo "HMMA in SASS: $(cuobjdump -sass linear_attention.cu.o | grep -c HMMA)"
        cuobjdump -res-usage linear_attention.cu.o 2>&1 | grep -A1 "tensor_core\|Lb1EEv" | grep -oE "REG:[0-9]+|SHARED:[0-9]+|LOCAL:[0-9]+" | paste - - - | head -4 ;;
  memcheck) suite memcheck 3 "compute-sanitizer --tool memcheck --error-exitcode 9"
            grep -hE "ERROR SUMMARY" $OUT/memcheck.log | sort | uniq -c ;;
  racecheck) suite racecheck 3 "compute-sanitizer --tool racecheck --error-exitcode 9"
             grep -hE "RACECHECK SUMMARY|ERROR SUMMARY" $OUT/racecheck.log | sort | uniq -c ;;
  bench) ./bench_linear_attention_cuda --benchmark_out=$OUT/bench.json --benchmark_out_format=json 2>&1 | grep -E "median" | awk '{print $1, $2, $3}' ;;
esac; done
