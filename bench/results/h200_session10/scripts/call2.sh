#!/bin/bash
# Session 10, call 2: eb46c05's bench and this build's (call 1's kernels again, rebuilt) one after the other;
# every GPU suite with CI's seed beside the forward suite under memcheck, racecheck and initcheck (call 1 ran seeds
# 1..20 of the forward suite on these kernels); then the side-by-side run of DeltaNet and Gated DeltaNet with this
# build's kernels (each judged by the oracle before it is timed).
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
for v in before; do xz -dc .dev-pack/bench_$v.xz > /tmp/r/bench_$v && chmod +x /tmp/r/bench_$v; done
tar -xJf .dev-pack/sbs.tar.xz  # .peers, build/release/python/deltaproof, build/release/bench/h200/libdeltaproof_kernels.so
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(WyPrepare|ChunkScan|Forward|BackwardPrepare)/|BM_DeltaRuleForwardBackward/C:64'
mkdir -p /tmp/bj
for v in before after; do
  bin=$B/bench/bench_delta_rule_cuda; [ $v != after ] && bin=/tmp/r/bench_$v
  timeout 100 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/bench_$v.json --benchmark_out_format=json > /tmp/b_$v.txt 2>&1
  echo "$v rc=$?"
done
tar -czf $OUT/bench_json.tgz -C /tmp/bj .
for v in before after; do echo "== $v"; grep -E "_median" /tmp/b_$v.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'; done
cd $B/property_tests
start=$(date +%s)
for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test \
         linear_attention_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 150 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE  # the ctest files' absolute paths
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
timeout 200 ctest --test-dir $B/property_tests -L gpu-sanitize -R 'sanitize\.(memcheck|racecheck|initcheck)\.DeltaRuleGpu\.' \
  -j 9 --timeout 190 > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$?" >> $OUT/summary.txt
wait
echo "suites and sanitizers $(( $(date +%s) - start )) s" >> $OUT/summary.txt
tar -czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls suite_*.log)
cat $OUT/summary.txt; grep -v "rc=0" $OUT/suites.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/suites.txt) of 6"
grep -hE "tests passed|tests failed|Failed|\*\*\*|Timeout" $OUT/sanitize.txt | head
grep -hE "^\[  FAILED|accuracy \(bf16" /tmp/suite_*.log | cut -c1-200 | head
cd - > /dev/null
start=$(date +%s)
OUT=/tmp/sbs timeout 280 bash bench/h200/side_by_side.sh delta,gated-delta --budget-s 240 > /tmp/sbs_log.txt 2>&1
echo "side by side rc=$? $(( $(date +%s) - start )) s" >> $OUT/summary.txt
cp /tmp/sbs_log.txt $OUT/side_by_side.log; tar -czf $OUT/side_by_side.tgz -C /tmp sbs
tail -32 /tmp/sbs_log.txt
