#!/bin/bash
# Session 9, call 2: 4650fb0's bench and this build's alternating; ncu of this build's Gated C = 64 prepare (with
# per-line source counters); every GPU suite once with CI's seed, then four property suites with seeds 1..20.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
xz -dc .dev-pack/bench_before.xz > /tmp/r/bench_before && chmod +x /tmp/r/bench_before
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -d "$SRC" ] && [ ! -L "$SRC" ]; then [ -e "$SRC/build/release/property_tests/CTestTestfile.cmake" ] || { rm -rf "$SRC/build"; ln -s /tmp/r/build "$SRC/build"; }; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(WyPrepare|Forward|BackwardPrepare)/|BM_DeltaRuleForwardBackward/C:64'
mkdir -p /tmp/bj
for i in 1 2; do
  for v in before after; do
    bin=$B/bench/bench_delta_rule_cuda; [ $v = before ] && bin=/tmp/r/bench_before
    timeout 150 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/bench_${v}_$i.json --benchmark_out_format=json > /tmp/b_${v}_$i.txt 2>&1
    echo "$v $i rc=$?"
  done
done
tar -czf $OUT/bench_json.tgz -C /tmp/bj .
timeout 90 ncu --clock-control none -k regex:wy_prepare_async_kernel -c 1 --launch-skip 3 --set full --import-source yes -o /tmp/prep \
  $B/bench/bench_delta_rule_cuda --benchmark_filter='BM_DeltaRuleWyPrepare/C:64/gated:1' --benchmark_repetitions=1 > /tmp/ncu_log.txt 2>&1
echo "ncu rc=$?"
ncu -i /tmp/prep.ncu-rep > /tmp/ncu_after2.txt 2>&1
ncu -i /tmp/prep.ncu-rep --page source --csv --print-source cuda > /tmp/ncu_source.csv 2>&1; echo "source rc=$?"
tar -czf $OUT/ncu_prepare2.tgz -C /tmp ncu_after2.txt ncu_source.csv ncu_log.txt
cd $B/property_tests
for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test \
         linear_attention_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 280 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
wait
tar -czf $OUT/suite_logs.tgz -C /tmp $(cd /tmp && ls suite_*.log)
grep -hE "^\[  FAILED|^\[  PASSED|accuracy" /tmp/suite_*.log | cut -c1-220 | head -20
cat $OUT/suites.txt
OUT=/tmp/seeds SEED_TIMEOUT=170 bash /tmp/r/bench/h200/full_run.sh seeds delta_rule_gpu_test delta_rule_backward_gpu_test \
  linear_attention_gpu_test delta_rule_strides_gpu_test > $OUT/seeds.txt 2>&1
cp /tmp/seeds/seed_logs.tgz $OUT/ 2>/dev/null
cat $OUT/seeds.txt | head -30
for f in /tmp/b_*.txt; do echo "== $f"; grep -E "_median" $f | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'; done
grep -E "Duration|Executed Instructions  |Spilling Requests|excessive|Issued Warp" /tmp/ncu_after2.txt | head
head -c 600 /tmp/ncu_source.csv
