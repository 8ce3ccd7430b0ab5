#!/bin/bash
# Session 17, call 1: where stage 4's time goes, by source line. ncu (full set, source counters) on one launch of
# chunk_gradients_kernel at C = 64, DeltaNet and Gated, on 43c330e's build (the session's starting point).
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
ncu --version | tail -1 >> $OUT/gpu.txt
cd /tmp
for g in 0 1; do
  timeout 150 ncu --clock-control none --set full --import-source yes -k regex:chunk_gradients_kernel -c 1 -f -o /tmp/s4_g$g \
    $B/bench/bench_delta_rule_cuda --benchmark_filter="BM_DeltaRuleBackwardChunkGradients/C:64/gated:$g" \
    --benchmark_repetitions=1 > /tmp/ncu_g$g.log 2>&1
  echo "ncu gated=$g rc=$?" >> $OUT/runs.txt
  for view in cuda sass; do
    ncu -i /tmp/s4_g$g.ncu-rep --page source --csv --print-source $view > $OUT/source_${view}_g$g.csv 2> $OUT/source_${view}_g$g.err
    echo "source $view g$g rc=$? lines=$(wc -l < $OUT/source_${view}_g$g.csv)" >> $OUT/runs.txt
  done
  ncu -i /tmp/s4_g$g.ncu-rep --page details --print-details all > $OUT/details_g$g.txt 2>&1
done
cp /tmp/s4_g0.ncu-rep /tmp/s4_g1.ncu-rep $OUT/ 2>/dev/null
cat $OUT/gpu.txt $OUT/runs.txt
grep -E "Duration|DRAM Throughput|Issued Warp|No Eligible|Achieved Occupancy|Registers Per|Shared Memory Config|Dynamic Shared" $OUT/details_g0.txt | head -12
head -3 $OUT/source_cuda_g0.csv | cut -c1-600
