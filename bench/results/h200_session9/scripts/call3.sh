#!/bin/bash
# Session 9, call 3: the command line's gradient checks (issue 11's cases), then every GPU test under the four
# sanitizers beside the long-sequence runs (bench/h200/full_run.sh sanitize), on this build.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
for op in delta gated-delta; do
  timeout 40 $B/tools/deltaproof gradcheck --impl cuda --op $op > /tmp/cli_$op.txt 2>&1; echo "gradcheck $op default rc=$?"
  timeout 40 $B/tools/deltaproof gradcheck --impl cuda --op $op --L 100 --C 64 --dk 48 --dv 32 >> /tmp/cli_$op.txt 2>&1
  echo "gradcheck $op --L 100 --C 64 --dk 48 --dv 32 rc=$?"
done > $OUT/cli_rc.txt
cat /tmp/cli_delta.txt /tmp/cli_gated-delta.txt > $OUT/gradcheck_cli.txt
SANITIZE_TIMEOUT=500 bash /tmp/r/bench/h200/full_run.sh sanitize
cp /tmp/full_run_out/sanitize.txt /tmp/full_run_out/long.txt $OUT/ 2>/dev/null
cat $OUT/cli_rc.txt
