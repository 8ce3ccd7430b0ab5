#!/bin/bash
# Carries a CUDA build to a machine with a GPU but no compiler: the GPU test binaries with the
# build's ctest files, the benchmarks, the command line and the shared libraries they load (glibc and
# the driver's libcuda excepted), in one xz archive of a few MB, paths relative to the checkout.
#
#   bash bench/gpu/pack.sh [ARCHIVE]            here, after cmake --build (default ARCHIVE:
#                                               .dev-pack/build.tar.xz, ignored by git)
#   bash bench/gpu/pack.sh --unpack [ARCHIVE]   there, in a checkout of the same commit: restores
#                                               BUILD_DIR and points its ctest files at this checkout
# then `bash bench/gpu/run.sh ...` there, with the same BUILD_DIR.
#
# Settings (environment): BUILD_DIR [build/release], relative to the checkout; MULTI_GPU [0]: 1 packs the
# multi-gpu tests too, with the NCCL library they load.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build/release}
case $BUILD_DIR in /*) echo "pack.sh: BUILD_DIR must be relative to the checkout" >&2; exit 2 ;; esac

if [ "${1:-}" = "--unpack" ]; then
  archive=${2:-.dev-pack/build.tar.xz}
  tar -xJf "$archive"
  from=$(cat "$BUILD_DIR/packed_from")
  # ctest files name the checkout they were generated in: name this one instead.
  find "$BUILD_DIR" -name '*.cmake' -exec sed -i "s|$from|$PWD|g" {} +
  echo "unpacked $archive into $BUILD_DIR (built in $from)"
  exit 0
fi

archive=${1:-.dev-pack/build.tar.xz}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
B=$stage/$BUILD_DIR
mkdir -p "$B/property_tests" "$B/bench" "$B/tools" "$B/packed_libs"
binaries=()
# Every executable a test labelled gpu runs (ctest's own list), kernel_size_limits_test too.
# The multi-gpu tests (and the NCCL library they load, ~200 MB) only when MULTI_GPU=1.
exclude=multi-gpu
[ "${MULTI_GPU:-0}" = 1 ] && exclude='^$'
gpu_tests=$(ctest --test-dir "$BUILD_DIR" -N -L gpu -LE "$exclude" --show-only=json-v1 |
  python3 -c 'import json, sys; print("\n".join(sorted({t["command"][0] for t in json.load(sys.stdin)["tests"] if "command" in t})))')
for t in $gpu_tests "$PWD/$BUILD_DIR/property_tests/kernel_size_limits_test"; do
  case $t in "$PWD/$BUILD_DIR"/property_tests/*) ;; *) continue ;; esac  # compute-sanitizer's runs name the same binaries
  if [ -x "$t" ]; then binaries+=("$t"); strip -o "$B/property_tests/$(basename "$t")" "$t"; fi
done
cp "$BUILD_DIR"/property_tests/*.cmake "$B/property_tests/"
cp "$BUILD_DIR"/CTestTestfile.cmake "$B/"
for d in "$BUILD_DIR"/*/; do  # the top-level ctest file names every subdirectory: give each one an empty file
  sub=$B/$(basename "$d")
  if [ -f "$d/CTestTestfile.cmake" ] && [ ! -f "$sub/CTestTestfile.cmake" ]; then mkdir -p "$sub"; : > "$sub/CTestTestfile.cmake"; fi
done
for b in bench/bench_linear_attention_cuda bench/bench_delta_rule_cuda tools/deltaproof; do
  if [ -x "$BUILD_DIR/$b" ]; then binaries+=("$BUILD_DIR/$b"); strip -o "$B/$b" "$BUILD_DIR/$b"; fi
done
mkdir -p "$B/CMakeFiles" && cp -r "$BUILD_DIR"/CMakeFiles/[0-9]* "$B/CMakeFiles/" 2>/dev/null || true
# Shared libraries the binaries load, but glibc's, the loader and the driver's.
ldd "${binaries[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  { grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libnvidia[^/]*)\.so' || true; } |
  while read -r lib; do cp -L "$lib" "$B/packed_libs/"; done
realpath . > "$B/packed_from"
mkdir -p "$(dirname "$archive")"
tar -C "$stage" -cf - . | xz -T2 -9 > "$archive"  # -9: the binaries share most of their bytes
ls -l "$archive"
