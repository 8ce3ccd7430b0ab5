#!/bin/bash
# Packs what bench/h200/full_run.sh runs into .dev-pack/run.tar.xz (≤ 64 MiB, carried to the device):
# the GPU test binaries with the build's ctest files (paths kept under the checkout, since ctest files
# hold absolute paths), the benchmark, the command line, and the shared libraries the device lacks.
set -eu
cd "$(dirname "$0")/../.."
B=build/release
stage=$(mktemp -d)
mkdir -p "$stage/$B/property_tests" "$stage/$B/bench" "$stage/$B/tools" "$stage/lib" "$stage/bench/h200"
gpu_tests="delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test
           linear_attention_gpu_test kernel_size_limits_test long_sequence_gpu_test"
for t in $gpu_tests; do strip -o "$stage/$B/property_tests/$t" "$B/property_tests/$t"; done
cp "$B"/property_tests/*.cmake "$stage/$B/property_tests/"
strip -o "$stage/$B/bench/bench_delta_rule_cuda" "$B/bench/bench_delta_rule_cuda"
strip -o "$stage/$B/tools/deltaproof" "$B/tools/deltaproof"
for lib in libbenchmark.so.1debian libzip.so.4 libbz2.so.1.0; do
  cp "$(ldconfig -p | awk -v l=$lib '$1 == l {print $NF; exit}')" "$stage/lib/"
done
cp bench/h200/full_run.sh "$stage/bench/h200/"
echo "export DELTAPROOF_BUILD_SOURCE=$PWD" > "$stage/source.sh"
mkdir -p .dev-pack
tar -C "$stage" -cf - . | xz -T2 -9 > .dev-pack/run.tar.xz  # -9: ≈ 11 MB where -2 gave ≈ 43 (the binaries share most of their bytes), in ≈ 1 min
rm -rf "$stage"
ls -l .dev-pack/run.tar.xz
