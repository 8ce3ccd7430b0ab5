#!/bin/bash
# Session 12, call 4: the linear side-by-side again on v12 (call 3's JSON did not come back: a call returns at most
# 8 files), everything in one archive; then the long linear runs (2^20 tokens) on v12.
set -u
tar -xJf .dev-pack/sbs.tar.xz
mkdir -p /tmp/sbs && OUT=/tmp/sbs timeout 200 bash bench/h200/side_by_side.sh linear --budget-s 170 > /tmp/sbs/run.txt 2>&1
echo "side by side rc=$?" > $OUT/summary.txt
tar -czf $OUT/sbs.tgz -C /tmp/sbs .
grep -E '^[0-9:]+ == |done' /tmp/sbs/run.txt | cut -c1-150
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
timeout 100 ctest --test-dir $B/property_tests -L long -R 'LinearAttention' -j 3 --timeout 90 > $OUT/long.txt 2>&1
echo "long rc=$?" >> $OUT/summary.txt
cat $OUT/summary.txt; grep -hE "tests passed|tests failed|\*\*\*Failed|Timeout" $OUT/long.txt
