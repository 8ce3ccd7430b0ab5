#!/bin/bash
# Session 11, call 1: the tree's DeltaNet forward (ce0200e) and 391f6be's prepare variant alternating twice;
# this session's linear-attention baseline; the linear forward pass's SASS and one ncu profile of it.
set -u
mkdir -p /tmp/c1 && tar -xJf .dev-pack/c1.tar.xz -C /tmp/c1 && cd /tmp/c1
export LD_LIBRARY_PATH=/tmp/c1/lib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
F='BM_DeltaRule(WyPrepare|ChunkScan|Forward)/'
mkdir -p /tmp/bj
for run in tree_1 var_1 tree_2 var_2; do
  start=$(date +%s)
  timeout 120 ./bench_${run%_*} --benchmark_filter="$F" --benchmark_out=/tmp/bj/$run.json --benchmark_out_format=json > /tmp/bj/$run.txt 2>&1
  echo "$run rc=$? $(( $(date +%s) - start )) s" >> $OUT/runs.txt
done
timeout 60 ./bench_linear --benchmark_out=/tmp/bj/linear.json --benchmark_out_format=json > /tmp/bj/linear.txt 2>&1
echo "linear rc=$?" >> $OUT/runs.txt
tar -czf $OUT/bench_json.tgz -C /tmp/bj .
cuobjdump -sass ./bench_linear > /tmp/all.sass 2>&1
awk '/Function : /{keep = ($0 ~ /pass_tensor_core/ && $0 ~ /Li64ELb0E/ && $0 ~ /Faithful/)} keep' /tmp/all.sass > $OUT/linear_fwd64.sass
wc -l $OUT/linear_fwd64.sass >> $OUT/runs.txt
timeout 120 ncu --clock-control none -k regex:pass_tensor_core -c 1 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section InstructionStats --section SourceCounters --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --print-details all ./bench_linear --benchmark_filter='BM_LinearAttentionForward/C:64' > $OUT/ncu_linear_fwd64.txt 2>&1
echo "ncu rc=$?" >> $OUT/runs.txt
cat $OUT/runs.txt
for f in /tmp/bj/*.txt; do echo "== $f"; grep -E "_median" $f | awk '{print $1, $2}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'; done
