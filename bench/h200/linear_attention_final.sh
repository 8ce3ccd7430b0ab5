#!/bin/bash
# Final run: SASS check and benchmark alone; then the suite (14 shards, 30 cases per property)
# alongside compute-sanitizer memcheck and racecheck (5 shards each, 3 cases per property).
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD:$LD_LIBRARY_PATH PATH=$PATH:/usr/local/cuda/bin
./linear_attention_run.sh sass bench
start=$(date +%s)
for tool in memcheck racecheck; do
  for i in 0 1 2 3 4; do
    GTEST_TOTAL_SHARDS=5 GTEST_SHARD_INDEX=$i RC_PARAMS="max_success=3 seed=1" timeout ${SAN_TIMEOUT:-110} \
      compute-sanitizer --tool $tool --error-exitcode 9 ./linear_attention_gpu_test > $OUT/${tool}_$i.log 2>&1 &
  done
done
TEST_TIMEOUT=110 ./linear_attention_run.sh tests
wait
echo "== sanitizers: $(( $(date +%s) - start )) s"
for tool in memcheck racecheck; do
  cat $OUT/${tool}_*.log > $OUT/$tool.log; rm $OUT/${tool}_*.log
  echo "$tool: tests OK $(grep -c 'OK \]' $OUT/$tool.log), FAILED $(grep -c 'FAILED  \]' $OUT/$tool.log), skipped $(grep -c 'SKIPPED \]' $OUT/$tool.log); summaries:"
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" $OUT/$tool.log | sort | uniq -c
done
