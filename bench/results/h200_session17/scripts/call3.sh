#!/bin/bash
# Session 17, call 3: where the instructions go now, by source line, in each kernel of the training step (C = 64,
# DeltaNet; stage 4 and the gradient scan also Gated), on call 2's build.
set -u
mkdir -p /tmp/r && tar -xJf .dev-pack/run.tar.xz -C /tmp/r
B=/tmp/r/build/release; export LD_LIBRARY_PATH=/tmp/r/lib
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $OUT/gpu.txt
mkdir -p /tmp/src && cd /tmp/src
for spec in wy_prepare_async_kernel:0 chunk_scan_registers_kernel:0 chunk_output_kernel:0 gradient_scan_registers_kernel:0 \
            chunk_gradients_kernel:0 gradient_scan_registers_kernel:1 chunk_gradients_kernel:1; do
  k=${spec%:*}; g=${spec#*:}
  timeout 120 ncu --clock-control none --set full --import-source yes -k regex:$k -c 1 -f -o /tmp/src/${k}_g$g \
    $B/bench/bench_delta_rule_cuda --benchmark_filter="BM_DeltaRuleForwardBackward/C:64/gated:$g" > /tmp/src/${k}_g$g.log 2>&1
  echo "ncu $k g$g rc=$?" >> $OUT/runs.txt
  ncu -i /tmp/src/${k}_g$g.ncu-rep --page source --csv --print-source cuda,sass > /tmp/src/${k}_g$g.csv 2>> $OUT/runs.txt
  ncu -i /tmp/src/${k}_g$g.ncu-rep --page details --print-details all > /tmp/src/${k}_g$g.details.txt 2>&1
  grep -E "^    (Duration|Issued Warp Per Scheduler|No Eligible|Registers Per Thread|Achieved Occupancy|Dynamic Shared Memory Per Block) " /tmp/src/${k}_g$g.details.txt | sort -u | sed "s/^/$k g$g /" >> $OUT/summary.txt
done
tar -czf $OUT/src.tgz *.csv *.details.txt
cat $OUT/gpu.txt $OUT/runs.txt $OUT/summary.txt
