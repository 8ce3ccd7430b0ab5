#!/bin/bash
# Session 19, call 1 (the session's only one: 269 s of device time were left): the final kernels (7dbf8c7, those of
# 5368f4b) beside fla on the same tensors, DeltaNet's forward and training step at C = 64, so that the report's
# side-by-side holds this build's records (session 18's call 6 lost its JSON to a wrong file name). Carried: the Python
# package, libdeltaproof_kernels.so and .peers (`bash bench/h200/side_by_side.sh --stage` here).
set -u
mkdir -p /tmp/sbs
OUT=/tmp/sbs timeout 200 bash bench/h200/side_by_side.sh delta --passes forward,forward+backward --impls deltaproof,fla \
  --chunk-sizes 64 --budget-s 160 > /tmp/sbs/run.txt 2>&1
echo "side by side rc=$?" > $OUT/runs.txt
cp /tmp/sbs/side_by_side_delta*.json /tmp/sbs/gpu.txt $OUT/ 2>/dev/null
tail -c 4000 /tmp/sbs/run.txt > $OUT/run_tail.txt
cat $OUT/runs.txt; ls $OUT; tail -n 12 /tmp/sbs/run.txt
