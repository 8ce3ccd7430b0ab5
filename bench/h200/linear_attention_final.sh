#!/bin/bash
# Final run: the benchmark alone; then the suite (14 shards, 30 cases per property) alongside
# compute-sanitizer memcheck and racecheck (3 cases per property); then the command line.
cd "$(dirname "$0")"
./linear_attention_run.sh bench
start=$(date +%s)
SAN_TIMEOUT=${SAN_TIMEOUT:-300}
TEST_TIMEOUT=$SAN_TIMEOUT ./linear_attention_run.sh memcheck > $OUT/memcheck_summary.txt 2>&1 &
TEST_TIMEOUT=$SAN_TIMEOUT ./linear_attention_run.sh racecheck > $OUT/racecheck_summary.txt 2>&1 &
TEST_TIMEOUT=150 ./linear_attention_run.sh tests
wait
echo "== sanitizers: $(( $(date +%s) - start )) s"
cat $OUT/memcheck_summary.txt $OUT/racecheck_summary.txt
./linear_attention_run.sh cli
