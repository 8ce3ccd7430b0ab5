#!/bin/bash
# Session 17, call 4: round 2 of stage 4 (β and the log-gates prefetched into warp 0's registers; the second state
# tile requested at the top of an item, one barrier a tile in P2). 40c960a's benchmark (round 1, before) and this build
# (after) alternating twice on the training step, its halves and the backward's stages at C = 64, once at C = 16 and
# 32; gradcheck JSON of both builds compared byte for byte; every DeltaNet GPU suite with CI's
# seed on this build.
set -u
mkdir -p /tmp/r /tmp/before && tar -xJf .dev-pack/run.tar.xz -C /tmp/r && tar -xJf .dev-pack/before.tar.xz -C /tmp/before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(ForwardBackward|TrainingForward|BackwardFromSaved|BackwardChunkGradients|BackwardGradientScan|BackwardStatePass|Forward)/C:64/'
F2='BM_DeltaRule(ForwardBackward|BackwardChunkGradients)/C:(16|32)/'
mkdir -p /tmp/bj /tmp/gc
start=$(date +%s)
for run in before_1 after_1 before_2 after_2; do
  case ${run%_*} in before) bin=/tmp/before/bench_delta_rule_cuda_40c960a;; after) bin=$B/bench/bench_delta_rule_cuda;; esac
  timeout 120 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
for run in before_c after_c; do
  case ${run%_*} in before) bin=/tmp/before/bench_delta_rule_cuda_40c960a;; after) bin=$B/bench/bench_delta_rule_cuda;; esac
  timeout 120 $bin --benchmark_filter="$F2" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
echo "timing $(( $(date +%s) - start )) s" >> $OUT/runs.txt
for which in before after; do
  case $which in before) tool=/tmp/before/deltaproof_40c960a;; after) tool=$B/tools/deltaproof;; esac
  for op in delta gated-delta; do
    for args in "" "--L 100 --C 64 --dk 48 --dv 32" "--L 300 --C 32 --dk 128 --dv 96"; do
      tag=$op$(echo $args | tr -d ' -')
      timeout 60 $tool gradcheck --impl cuda --op $op $args --json > /tmp/gc/${which}_$tag.json 2>&1
      echo "gradcheck $which $op $args: rc=$?" >> $OUT/runs.txt
    done
  done
done
for f in /tmp/gc/after_*.json; do b=/tmp/gc/before_${f#/tmp/gc/after_}; cmp -s $f $b && echo "identical ${f#/tmp/gc/after_}" || echo "DIFFER ${f#/tmp/gc/after_}"; done >> $OUT/runs.txt
cd $B/property_tests
start=$(date +%s)
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test kernel_size_limits_test; do
  (RC_PARAMS="seed=20261129" timeout 250 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?") &
done > $OUT/suites.txt
wait
echo "suites $(( $(date +%s) - start )) s" >> $OUT/runs.txt
tar -czf $OUT/out.tgz -C /tmp bj gc $(cd /tmp && ls ci_*.log)
cat $OUT/gpu.txt $OUT/runs.txt $OUT/suites.txt
for run in before_1 after_1 before_2 after_2 before_c after_c; do echo "== $run"; grep -E "_median" /tmp/bj/$run.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||' | paste -sd' '; done
