#!/bin/bash
# Session 9, call 1: prepare's whole-sector stores, before (4650fb0) and after alternating; ncu of the prepare
# both ways; every GPU suite once with CI's seed on the after build.
set -u
R=$PWD
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
xz -dc .dev-pack/bench_before.xz > /tmp/r/bench_before && chmod +x /tmp/r/bench_before
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -d "$SRC" ] && [ ! -L "$SRC" ]; then [ -e "$SRC/build/release/property_tests/CTestTestfile.cmake" ] || { rm -rf "$SRC/build"; ln -s /tmp/r/build "$SRC/build"; }; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(WyPrepare|Forward|BackwardPrepare)/|BM_DeltaRuleForwardBackward/C:64'
for i in 1 2; do
  for v in before after; do
    bin=$B/bench/bench_delta_rule_cuda; [ $v = before ] && bin=/tmp/r/bench_before
    timeout 150 $bin --benchmark_filter="$F" --benchmark_out=$OUT/bench_${v}_$i.json --benchmark_out_format=json > /tmp/b_${v}_$i.txt 2>&1
    echo "$v $i rc=$?"
  done
done
for v in before after; do
  bin=$B/bench/bench_delta_rule_cuda; [ $v = before ] && bin=/tmp/r/bench_before
  timeout 60 ncu --clock-control none -k regex:wy_prepare_async_kernel -c 1 --launch-skip 3 --set full \
    $bin --benchmark_filter='BM_DeltaRuleWyPrepare/C:64/gated:1' --benchmark_repetitions=1 > /tmp/ncu_$v.txt 2>&1
  echo "ncu $v rc=$?"
done
tar -czf $OUT/ncu_prepare.tgz -C /tmp ncu_before.txt ncu_after.txt
cd $B/property_tests
for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test \
         linear_attention_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 280 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
wait
tar -czf $OUT/suite_logs.tgz -C /tmp $(cd /tmp && ls suite_*.log)
grep -hE "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|accuracy|OUTSIDE" /tmp/suite_*.log | cut -c1-200 | head -40
cat $OUT/suites.txt
for f in /tmp/b_*.txt; do echo "== $f"; grep -E "_median" $f | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'; done
grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Issued Warp|No Eligible" /tmp/ncu_before.txt /tmp/ncu_after.txt | head -30
cat $OUT/gpu.txt
