#!/bin/bash
# The side-by-side run (side_by_side.py): deltaproof's kernels, fla's and the article's on the same
# tensors in one process on the H200. Two modes:
#
#   bash bench/h200/side_by_side.sh --stage            here: builds what the device needs, copies the peers
#   bash bench/h200/side_by_side.sh OP [ARGS...]       on the device, from the repository root: one op
#                                                      (linear, delta or gated-delta) per call, since fla
#                                                      autotunes each kernel afresh and a call has 600 s
#
# The device needs, carried from here: build/release/python/deltaproof (the package; it judges through
# libdeltaproof_judge.so there), build/release/bench/h200/libdeltaproof_kernels.so and .peers (a copy
# of ../shared/peers). Writes $OUT/side_by_side_<op>.json (read by bench/report.py), its log, gpu.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "${1:-}" = "--stage" ]; then
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  [ -f build/release/build.ninja ] || cmake --preset release
  cmake --build build/release --target deltaproof_judge_c deltaproof_python_files deltaproof_kernels_c -j2
  rm -rf .peers && cp -r ../shared/peers .peers
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.peers/' "$exclude" 2>/dev/null || echo /.peers/ >> "$exclude"
  du -sh .peers build/release/python/deltaproof build/release/bench/h200/libdeltaproof_kernels.so
  exit 0
fi

op=${1:?usage: side_by_side.sh --stage | side_by_side.sh OP [side_by_side.py arguments]}
shift
: "${OUT:=side_by_side_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/build/release/python" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt" 2>&1 || true
python3 bench/h200/side_by_side.py --ops "$op" --out "$OUT" \
  --peers .peers --kernels-lib build/release/bench/h200/libdeltaproof_kernels.so "$@"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader >> "$OUT/gpu.txt" 2>&1 || true
