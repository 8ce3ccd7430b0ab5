#!/bin/bash
# Session 12, call 1: linear attention v10 (caebc79, the tree) and v10b (78f6404) alternating twice; on the tree's
# build: every GPU suite (CI's seed), seeds 11..20 of the DeltaNet backward and strides suites, gradcheck of the three
# CUDA ops on two cases each, every long test.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
for v in v10 v10b; do xz -dc .dev-pack/bl_$v.xz > /tmp/r/bl_$v && chmod +x /tmp/r/bl_$v; done
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
mkdir -p /tmp/bj
for run in v10_1 v10b_1 v10_2 v10b_2; do
  timeout 60 /tmp/r/bl_${run%_*} --benchmark_filter='BM_LinearAttention(Forward|Backward)/' --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
tar -czf $OUT/bench_json.tgz -C /tmp/bj .
cd $B/property_tests
start=$(date +%s)
for t in linear_attention_gpu_test delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 250 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test; do
  for s in $(seq 11 20); do
    (RC_PARAMS="seed=$s max_success=4" timeout 250 ./$t --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_${t}_$s.log 2>&1; echo "$t seed $s rc=$?") &
  done
done > $OUT/seeds.txt
for op in linear delta gated-delta; do
  timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op > /tmp/cli_$op.txt 2>&1; echo "gradcheck $op default rc=$?"
  timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op --L 100 --C 64 --dk 48 --dv 32 >> /tmp/cli_$op.txt 2>&1
  echo "gradcheck $op --L 100 --C 64 --dk 48 --dv 32 rc=$?"
done > $OUT/gradcheck.txt
cat /tmp/cli_*.txt > $OUT/gradcheck_cli.txt
wait
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/suites.txt
start=$(date +%s)
timeout 150 ctest --test-dir $B/property_tests -L long -j 4 --timeout 140 > $OUT/long.txt 2>&1
echo "long rc=$? $(( $(date +%s) - start )) s" >> $OUT/suites.txt
tar -czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls suite_*.log seed_*.log)
cat $OUT/runs.txt $OUT/suites.txt $OUT/gradcheck.txt; echo "seeds rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 20"; grep -v 'rc=0' $OUT/seeds.txt
grep -hE "^\[  FAILED" /tmp/suite_*.log /tmp/seed_*.log | cut -c1-160 | head -20
grep -hE "tests passed|tests failed|\*\*\*Failed|Timeout" $OUT/long.txt | head -20
for f in /tmp/bj/*.txt; do echo "== $f"; grep -E "_median" $f | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'; done
