#!/bin/bash
# Session 11, call 3: racecheck's reports for the three linear tests it failed in call 2 (v10), the SASS to read
# them against, and one ncu profile of v10's forward pass at C = 64.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
xz -dc .dev-pack/bl_new.xz > /tmp/r/bl_new && chmod +x /tmp/r/bl_new
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
cd $B/property_tests
for t in AwkwardAndLargeHeadDims AccuracyAtDesignShape; do
  RC_PARAMS="seed=20261129 max_success=3" timeout 200 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 30 \
    ./linear_attention_gpu_test --gtest_filter=LinearAttentionGpu.$t > $OUT/racecheck_$t.txt 2>&1 &
done
cuobjdump -sass ./linear_attention_gpu_test > /tmp/all.sass 2>&1
awk '/Function : /{keep = ($0 ~ /pass_tensor_core/ && $0 ~ /Li64E/ && $0 ~ /Faithful/)} keep' /tmp/all.sass > /tmp/tc64.sass
xz -c /tmp/tc64.sass > $OUT/tc64.sass.xz
timeout 120 ncu --clock-control none -k regex:pass_tensor_core_forward -c 1 --section SpeedOfLight --section WarpStateStats \
  --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis --print-details all \
  /tmp/r/bl_new --benchmark_filter='BM_LinearAttentionForward/C:64' > $OUT/ncu_v10_fwd64.txt 2>&1
wait
for f in $OUT/racecheck_*.txt; do echo "== $f"; grep -E "Race|Error|ERROR|hazard|Hazard|PASSED|FAILED|OK \]" $f | sort | uniq -c | sort -rn | head -12; done
grep -E "L1: Data Pipe Lsu Wavefronts|Duration|Issued Warp Per Scheduler|L1 Wavefronts Shared " $OUT/ncu_v10_fwd64.txt | head
