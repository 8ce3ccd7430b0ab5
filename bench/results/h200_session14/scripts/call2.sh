#!/bin/bash
# Session 14, call 2: the scans' copies moved off their first phase (the gradient scan's K and W, the register
# scan's K and P). Call 1's kernels (`bench_before`: 8961512 after a clean rebuild) and this build alternating twice
# (the scans, the forward and the training step; after_1 runs every benchmark, for the report's JSON); on this
# build seeds 41..60 of the backward suite and 41..50 of the strides and forward suites.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
xz -dc .dev-pack/bench_before.xz > /tmp/r/bench_before && chmod +x /tmp/r/bench_before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(ChunkScan|Forward|BackwardStatePass|BackwardGradientScan|ForwardBackward|TrainingForward|BackwardFromSaved)/'
mkdir -p /tmp/bj
for run in before_1 after_1 before_2 after_2; do
  bin=$B/bench/bench_delta_rule_cuda; [ ${run%_*} = before ] && bin=/tmp/r/bench_before
  filter=$F; [ $run = after_1 ] && filter=.
  timeout 200 $bin --benchmark_filter="$filter" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
cd $B/property_tests
start=$(date +%s)
{
for s in $(seq 41 60); do
  (RC_PARAMS="seed=$s max_success=4" timeout 200 ./delta_rule_backward_gpu_test --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_delta_rule_backward_gpu_test_$s.log 2>&1; echo "delta_rule_backward_gpu_test seed $s rc=$?") &
done
wait
for t in delta_rule_strides_gpu_test delta_rule_gpu_test; do
  for s in $(seq 41 50); do
    (RC_PARAMS="seed=$s max_success=4" timeout 200 ./$t --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' > /tmp/seed_${t}_$s.log 2>&1; echo "$t seed $s rc=$?") &
  done
done
wait
} > $OUT/seeds.txt
echo "suites and seeds $(( $(date +%s) - start )) s" >> $OUT/runs.txt
tar -czf $OUT/out.tgz -C /tmp bj $(cd /tmp && ls seed_*.log)
cat $OUT/runs.txt; grep -E "rc=[1-9]" $OUT/seeds.txt; echo "rc=0: $(grep -c 'rc=0' $OUT/seeds.txt) of 40"
for r in before_1 after_1 before_2 after_2; do echo "== $r"; grep -E "_median" /tmp/bj/$r.txt | grep -E "$F" | grep "C:64" | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||'; done
