#!/bin/bash
# Session 13, call 6: the command line's CUDA gradient check on the final build (its end-to-end comparison now takes
# the float64 recurrence's magnitudes): delta and gated-delta, the default case and --L 100 --C 64 --dk 48 --dv 32.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r ./build/release/tools/deltaproof ./lib
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
for op in delta gated-delta; do
  timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op > /tmp/cli_$op.txt 2>&1; echo "gradcheck $op default rc=$?"
  timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op --L 100 --C 64 --dk 48 --dv 32 >> /tmp/cli_$op.txt 2>&1
  echo "gradcheck $op L100 rc=$?"
done > $OUT/gradcheck.txt
cat /tmp/cli_delta.txt /tmp/cli_gated-delta.txt > $OUT/gradcheck_cli.txt
cat $OUT/gradcheck.txt; grep -iE "float64|verdict|agree" $OUT/gradcheck_cli.txt | head -12
