#!/bin/bash
# Session 18, call 4: stage 4 without the second barrier at the top of an item (P1 reads nothing written after the
# first) against call 3's build (f8e5087), alternating twice on every stage of the training step at C = 64; gradcheck
# JSON and `verify --impl cuda` output of both builds compared byte for byte; the DeltaNet device suites with CI's
# seed.
set -u
mkdir -p /tmp/r /tmp/before && tar -xJf .dev-pack/run.tar.xz -C /tmp/r && tar -xJf .dev-pack/before.tar.xz -C /tmp/before
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
. /tmp/r/source.sh; SRC=$DELTAPROOF_BUILD_SOURCE
if [ -e "$SRC" ]; then mkdir -p "$SRC/build/release" && ln -sfn $B/property_tests "$SRC/build/release/property_tests"; else mkdir -p "$(dirname "$SRC")" && ln -sfn /tmp/r "$SRC"; fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(ForwardBackward|TrainingForward|Forward|WyPrepare|ChunkScan|BackwardChunkGradients|BackwardGradientScan|BackwardStatePass|BackwardFromSaved)/C:64/'
mkdir -p /tmp/bj /tmp/gc
start=$(date +%s)
for run in before_1 after_1 before_2 after_2; do
  case ${run%_*} in before) bin=/tmp/before/bench_delta_rule_cuda_f8e5087;; after) bin=$B/bench/bench_delta_rule_cuda;; esac
  timeout 100 $bin --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$?" >> $OUT/runs.txt
done
echo "timing $(( $(date +%s) - start )) s" >> $OUT/runs.txt
start=$(date +%s)
for which in before after; do
  case $which in before) tool=/tmp/before/deltaproof_f8e5087;; after) tool=$B/tools/deltaproof;; esac
  for op in delta gated-delta; do
    for args in "" "--L 100 --C 64 --dk 48 --dv 32" "--L 300 --C 32 --dk 128 --dv 96"; do
      tag=$op$(echo $args | tr -d ' -')
      (timeout 150 $tool gradcheck --impl cuda --op $op $args --json > /tmp/gc/${which}_gc_$tag.txt 2>&1; echo "gradcheck $which $op $args: rc=$?" >> $OUT/runs.txt) &
    done
    for args in "--L 300 --C 64 --dk 128 --dv 128" "--L 77 --C 16 --dk 40 --dv 72" "--L 130 --C 32 --dk 128 --dv 64"; do
      tag=$op$(echo $args | tr -d ' -')
      (timeout 150 $tool verify --impl cuda --op $op $args > /tmp/gc/${which}_verify_$tag.txt 2>&1; echo "verify $which $op $args: rc=$?" >> $OUT/runs.txt) &
    done
  done
done
wait
echo "gradcheck and verify $(( $(date +%s) - start )) s" >> $OUT/runs.txt
for f in /tmp/gc/after_*; do b=/tmp/gc/before_${f#/tmp/gc/after_}; cmp -s $f $b && echo "identical ${f#/tmp/gc/after_}" || echo "DIFFER ${f#/tmp/gc/after_}"; done >> $OUT/runs.txt
cd $B/property_tests
start=$(date +%s)
for t in delta_rule_backward_gpu_test delta_rule_strides_gpu_test delta_rule_gpu_test bad_inputs_gpu_test; do
  (RC_PARAMS="seed=20261129" timeout 200 ./$t --gtest_color=no > /tmp/ci_$t.log 2>&1; echo "$t CI seed rc=$?" >> $OUT/runs.txt) &
done
wait
echo "suites $(( $(date +%s) - start )) s" >> $OUT/runs.txt
tar -czf $OUT/out.tgz -C /tmp bj gc $(cd /tmp && ls ci_*.log)
cat $OUT/gpu.txt $OUT/runs.txt
for run in before_1 after_1 before_2 after_2; do echo "== $run"; grep -E "_median" /tmp/bj/$run.txt | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||; s|BM_DeltaRule||; s|/C:64/gated:| g|' | paste -sd' '; done
