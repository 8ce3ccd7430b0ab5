#!/bin/bash
# Session 14, call 4: the DeltaNet / Gated DeltaNet side-by-side with fla and the article's kernels on the final build
# (every pass; forward + backward is now the training step, the forward keeping T, W and U for the backward).
set -u
tar -xJf .dev-pack/sbs.tar.xz
mkdir -p /tmp/sbs && OUT=/tmp/sbs timeout 420 bash bench/h200/side_by_side.sh delta,gated-delta --budget-s 360 > /tmp/sbs/run.txt 2>&1
echo "side by side rc=$?" > $OUT/summary.txt
tar -czf $OUT/sbs.tgz -C /tmp/sbs .
cat $OUT/summary.txt; grep -E '^[0-9:]+ == |done' /tmp/sbs/run.txt | cut -c1-160
