#!/bin/bash
# The side-by-side run (side_by_side.py): deltaproof's kernels, fla's and the derivation's Triton kernels on the same
# tensors in one process on a CUDA GPU. Two modes, from anywhere in the checkout:
#
#   bash bench/gpu/side_by_side.sh --stage        builds what the run needs and copies the peers into PEERS
#   bash bench/gpu/side_by_side.sh OP [ARGS...]   one op (linear, delta, gated-delta or a comma-separated
#                                                 list); ARGS go to side_by_side.py (--passes, --budget-s ...)
#
# Settings (environment, defaults in brackets):
#   BUILD_DIR   [build/release]   the build holding python/deltaproof and bench/gpu/libdeltaproof_kernels.so
#   OUT         [BUILD_DIR/side_by_side]  side_by_side_<op>.json (read by bench/report.py), its log, gpu.txt
#   PYTHON      [python3]         an interpreter with torch, triton and numpy
#   PEERS       [.peers]          the folder holding fla/ and article_kernels.py
#   PEERS_FROM  [../shared/peers] what --stage copies into PEERS
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build/release}
OUT=${OUT:-$BUILD_DIR/side_by_side}
PYTHON=${PYTHON:-python3}
PEERS=${PEERS:-.peers}
PEERS_FROM=${PEERS_FROM:-../shared/peers}
kernels_lib=$BUILD_DIR/bench/gpu/libdeltaproof_kernels.so

if [ "${1:-}" = "--stage" ]; then
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  [ -f "$BUILD_DIR/build.ninja" ] || [ -f "$BUILD_DIR/Makefile" ] || cmake --preset release
  cmake --build "$BUILD_DIR" --target deltaproof_judge_c deltaproof_python_files deltaproof_kernels_c -j2
  if [ "$(realpath -m "$PEERS_FROM")" != "$(realpath -m "$PEERS")" ]; then
    rm -rf "$PEERS" && cp -r "$PEERS_FROM" "$PEERS"
  fi
  if [ "$PEERS" = .peers ]; then  # keep the copy out of git
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.peers/' "$exclude" 2>/dev/null || echo /.peers/ >> "$exclude"
  fi
  du -sh "$PEERS" "$BUILD_DIR/python/deltaproof" "$kernels_lib"
  exit 0
fi

op=${1:?usage: side_by_side.sh --stage | side_by_side.sh OP [side_by_side.py arguments]}
shift
mkdir -p "$OUT"
export PYTHONPATH="$(realpath "$BUILD_DIR/python")" PYTHONUNBUFFERED=1
query=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw
nvidia-smi --query-gpu=$query --format=csv > "$OUT/gpu.txt" 2>&1 || true
"$PYTHON" bench/gpu/side_by_side.py --ops "$op" --out "$OUT" --peers "$PEERS" --kernels-lib "$kernels_lib" "$@"
nvidia-smi --query-gpu=$query --format=csv,noheader >> "$OUT/gpu.txt" 2>&1 || true
