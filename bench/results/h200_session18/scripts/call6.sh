#!/bin/bash
# Session 18, call 6: the final kernels (5368f4b) beside fla on the same tensors, DeltaNet's forward and training
# step at C = 64 (bench/h200/side_by_side.sh after `side_by_side.sh --stage` here; carried: the Python package,
# libdeltaproof_kernels.so and .peers).
set -u
mkdir -p /tmp/sbs
OUT=/tmp/sbs timeout 230 bash bench/h200/side_by_side.sh delta --passes forward,forward+backward --impls deltaproof,fla \
  --chunk-sizes 64 --budget-s 170 > /tmp/sbs/run.txt 2>&1
echo "side by side rc=$?" > $OUT/runs.txt
cp /tmp/sbs/side_by_side_delta.json /tmp/sbs/gpu.txt $OUT/ 2>/dev/null
tail -c 4000 /tmp/sbs/run.txt > $OUT/run_tail.txt
cat $OUT/runs.txt; tail -n 40 /tmp/sbs/run.txt
