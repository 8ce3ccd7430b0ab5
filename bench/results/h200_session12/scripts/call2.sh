#!/bin/bash
# Session 12, call 2: linear attention v10 (caebc79), v10b (78f6404) and v11 (406072e, the tree) alternating twice;
# on v11: the linear suite, bad inputs, size limits and strides (CI's seed), seeds 1..20 of the linear suite, every
# linear device test under memcheck, racecheck, synccheck and initcheck, the long linear runs.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
for v in v10 v10b v11; do xz -dc .dev-pack/bl_$v.xz > /tmp/r/bl_$v && chmod +x /tmp/r/bl_$v; done
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
mkdir -p /tmp/bj
for run in v10_1 v10b_1 v11_1 v10_2 v10b_2 v11_2; do
  timeout 60 /tmp/r/bl_${run%_*} --benchmark_filter='BM_LinearAttention(Forward|Backward)/' --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
tar -czf $OUT/bench_json.tgz -C /tmp/bj .
for f in /tmp/bj/*.txt; do echo "== $f"; grep -E "_median" $f | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'; done
cd $B/property_tests
start=$(date +%s)
for t in linear_attention_gpu_test bad_inputs_gpu_test kernel_size_limits_test delta_rule_strides_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
for s in $(seq 1 20); do
  (RC_PARAMS="seed=$s max_success=4" timeout 150 ./linear_attention_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_$s.log 2>&1; echo "seed $s rc=$?") &
  [ $((s % 10)) = 0 ] && wait
done > $OUT/seeds.txt
wait
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/suites.txt
start=$(date +%s)
timeout 240 ctest --test-dir $B/property_tests -L gpu-sanitize -R 'LinearAttention|KernelSizeLimits|InputRange|KernelPointers|NonFiniteInputs' -j 14 --timeout 230 > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$? $(( $(date +%s) - start )) s" >> $OUT/suites.txt
timeout 100 ctest --test-dir $B/property_tests -L long -R 'LinearAttention' -j 3 --timeout 90 > $OUT/long.txt 2>&1
echo "long rc=$?" >> $OUT/suites.txt
tar -czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls suite_*.log seed_*.log)
cat $OUT/runs.txt $OUT/suites.txt; echo "seeds rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 20"
grep -hE "^\[  FAILED|relative L2|rel L2" /tmp/suite_*.log /tmp/seed_*.log | cut -c1-160 | head -20
grep -hE "tests passed|tests failed|\*\*\*Failed|Timeout" $OUT/sanitize.txt $OUT/long.txt | head -20
