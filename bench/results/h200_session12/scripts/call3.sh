#!/bin/bash
# Session 12, call 3: linear attention v10b (78f6404) and v12 (f469819, the tree) alternating twice; on v12: the linear
# suite, bad inputs, size limits (CI's seed), seeds 1..20 of the linear suite, every linear device test under the four
# sanitizers; then the side-by-side of the linear op (deltaproof beside fla and the article's kernels).
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
for v in v10b v12; do xz -dc .dev-pack/bl_$v.xz > /tmp/r/bl_$v && chmod +x /tmp/r/bl_$v; done
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
mkdir -p /tmp/bj
for run in v10b_1 v12_1 v10b_2 v12_2; do
  timeout 60 /tmp/r/bl_${run%_*} --benchmark_filter='BM_LinearAttention(Forward|Backward)/' --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
tar -czf $OUT/bench_json.tgz -C /tmp/bj .
for f in /tmp/bj/*.txt; do echo "== $f"; grep -E "_median" $f | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'; done
(cd $B/property_tests
start=$(date +%s)
for t in linear_attention_gpu_test bad_inputs_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
for s in $(seq 1 20); do
  (RC_PARAMS="seed=$s max_success=4" timeout 150 ./linear_attention_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_$s.log 2>&1; echo "seed $s rc=$?") &
  [ $((s % 10)) = 0 ] && wait
done > $OUT/seeds.txt
wait
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/suites.txt
start=$(date +%s)
timeout 200 ctest --test-dir $B/property_tests -L gpu-sanitize -R 'LinearAttention|KernelSizeLimits|InputRange|KernelPointers|NonFiniteInputs' -j 14 --timeout 190 > $OUT/sanitize.txt 2>&1
echo "sanitize rc=$? $(( $(date +%s) - start )) s" >> $OUT/suites.txt)
tar -czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls suite_*.log seed_*.log)
cat $OUT/runs.txt $OUT/suites.txt; echo "seeds rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 20"
grep -hE "^\[  FAILED|o  *[0-9]|relative L2" /tmp/suite_linear*.log | cut -c1-160 | head -12
grep -hE "tests passed|tests failed|\*\*\*Failed|Timeout" $OUT/sanitize.txt | head -20
tar -xJf .dev-pack/sbs.tar.xz
mkdir -p $OUT/sbs && OUT=$OUT/sbs timeout 200 bash bench/h200/side_by_side.sh linear --budget-s 170 > $OUT/sbs/run.txt 2>&1
echo "side by side rc=$?"; tail -30 $OUT/sbs/run.txt
