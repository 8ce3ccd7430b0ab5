#!/bin/bash
# Session 13, call 1: 722c4e1's bench (S_[c], G' as pairs in stage 4) and this build's (rounded once), alternating
# twice (backward stages 2-4 and forward + backward, every C); on this build: the DeltaNet GPU suites with CI's
# seed (accuracy at the DESIGN shape), seeds 1..20 of the backward and strides suites, gradcheck of both ops.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
xz -dc .dev-pack/bench_before.xz > /tmp/r/bench_before && chmod +x /tmp/r/bench_before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(BackwardStatePass|BackwardGradientScan|BackwardChunkGradients|ForwardBackward)/'
mkdir -p /tmp/bj
for run in before_1 after_1 before_2 after_2; do
  bin=$B/bench/bench_delta_rule_cuda; [ ${run%_*} = before ] && bin=/tmp/r/bench_before
  start=$(date +%s)
  timeout 100 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$? $(( $(date +%s) - start )) s" >> $OUT/runs.txt
done
cd $B/property_tests
start=$(date +%s)
for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/suite_$t.log 2>&1; echo "$t rc=$?") &
done > $OUT/suites.txt
wait
echo "suites $(( $(date +%s) - start )) s" >> $OUT/suites.txt
start=$(date +%s)
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test; do
  for s in $(seq 1 20); do
    (RC_PARAMS="seed=$s max_success=4" timeout 200 ./$t --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_${t}_$s.log 2>&1; echo "$t seed $s rc=$?") &
    [ $((s % 10)) = 0 ] && wait
  done
done > $OUT/seeds.txt
wait
echo "seeds $(( $(date +%s) - start )) s" >> $OUT/seeds.txt
for op in delta gated-delta; do
  timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op > /tmp/cli_$op.txt 2>&1; echo "gradcheck $op default rc=$?"
  timeout 60 $B/tools/deltaproof gradcheck --impl cuda --op $op --L 100 --C 64 --dk 48 --dv 32 >> /tmp/cli_$op.txt 2>&1
  echo "gradcheck $op L100 rc=$?"
done > $OUT/gradcheck.txt
tar -czf $OUT/out.tgz -C /tmp bj $(cd /tmp && ls suite_*.log seed_*.log cli_*.txt)
cat $OUT/runs.txt $OUT/suites.txt $OUT/gradcheck.txt; grep -c "rc=0" $OUT/seeds.txt; tail -1 $OUT/seeds.txt
grep -hE "^\[  FAILED" /tmp/suite_*.log /tmp/seed_*.log | sort | uniq -c | head
grep -hiE "relative L2|rel\. L2|accuracy" /tmp/suite_delta_rule_backward_gpu_test.log | cut -c1-220 | head -12
for r in before_1 after_1 before_2 after_2; do echo "== $r"; grep -E "_median" /tmp/bj/$r.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'; done
