#!/bin/bash
# Session 10, call 1: eb46c05's bench and this build's, one after the other (forward stages, backward prepare
# and gradient scan, forward + backward at C = 64); where the prepare's spill sits (SASS); every GPU suite
# once with CI's seed; seeds 1..20 of the forward suite.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
xz -dc .dev-pack/bench_before.xz > /tmp/r/bench_before && chmod +x /tmp/r/bench_before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(WyPrepare|ChunkScan|Forward|BackwardPrepare|BackwardGradientScan)/|BM_DeltaRuleForwardBackward/C:64'
mkdir -p /tmp/bj
for v in before after; do
  bin=$B/bench/bench_delta_rule_cuda; [ $v = before ] && bin=/tmp/r/bench_before
  start=$(date +%s)
  timeout 150 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/bench_$v.json --benchmark_out_format=json > /tmp/b_$v.txt 2>&1
  echo "$v rc=$? $(( $(date +%s) - start )) s"
done
tar -czf $OUT/bench_json.tgz -C /tmp/bj .
cuobjdump -sass -fun '_ZN10deltaproof4cuda15forward_kernels23wy_prepare_async_kernelI13__nv_bfloat16Li64ENS1_15FaithfulPrepareEEEvNS0_10delta_rule18ForwardStageParamsE' \
  $B/bench/bench_delta_rule_cuda > /tmp/prep.sass 2>&1
{ wc -l < /tmp/prep.sass; grep -n -B3 -A1 -E "STL|LDL" /tmp/prep.sass | cut -c1-110; grep -n -E "BAR.SYNC|HMMA|LDGSTS" /tmp/prep.sass | awk -F: '{print $1}' | tr '\n' ' '; } > $OUT/prepare_spill.txt
for f in /tmp/b_*.txt; do echo "== $f"; grep -E "_median" $f | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'; done
cd $B/property_tests
start=$(date +%s)
for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test \
         linear_attention_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
wait
echo "suites $(( $(date +%s) - start )) s" >> $OUT/suites.txt
cat $OUT/suites.txt
grep -hE "^\[  FAILED|accuracy|rel L2" /tmp/suite_*.log | cut -c1-200 | head -20
start=$(date +%s)
for s in $(seq 1 20); do
  (RC_PARAMS="seed=$s max_success=4" timeout 150 ./delta_rule_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_$s.log 2>&1; echo "seed $s rc=$?") &
  [ $((s % 10)) = 0 ] && wait
done > $OUT/seeds.txt
wait
echo "seeds $(( $(date +%s) - start )) s" >> $OUT/seeds.txt
tar -czf $OUT/logs.tgz -C /tmp $(cd /tmp && ls suite_*.log seed_*.log)
grep -c "rc=0" $OUT/seeds.txt; tail -1 $OUT/seeds.txt
