#!/bin/bash
# Session 10, call 2: the side-by-side run of DeltaNet and Gated DeltaNet (this build's kernels beside fla's, each
# judged by the oracle before it is timed), then the forward suite under memcheck, racecheck and initcheck.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
tar -xJf .dev-pack/sbs.tar.xz  # .peers, build/release/python/deltaproof, build/release/bench/h200/libdeltaproof_kernels.so
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE  # the ctest files' absolute paths
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn /tmp/r/build/release/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
export LD_LIBRARY_PATH=/tmp/r/lib
start=$(date +%s)
OUT=/tmp/sbs timeout 340 bash bench/h200/side_by_side.sh delta,gated-delta --budget-s 300 > /tmp/sbs_log.txt 2>&1
echo "side by side rc=$? $(( $(date +%s) - start )) s" > $OUT/summary.txt
cp /tmp/sbs_log.txt $OUT/side_by_side.log; tar -czf $OUT/side_by_side.tgz -C /tmp sbs
start=$(date +%s)
timeout 220 ctest --test-dir /tmp/r/build/release/property_tests -L gpu-sanitize -R 'sanitize\.(memcheck|racecheck|initcheck)\.DeltaRuleGpu\.' \
  -j 14 --timeout 200 > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$? $(( $(date +%s) - start )) s" >> $OUT/summary.txt
cat $OUT/summary.txt
grep -hE "tests passed|Failed|\*\*\*|Timeout|Not Run" $OUT/sanitize.txt | head -20
tail -30 /tmp/sbs_log.txt
