#!/usr/bin/env bash
# Runs the CPU-emulation suites of a build with a fixed rapidcheck seed and prints, per suite, the name and
# hash of every tensor the suite reads back from the emulated kernels (DELTAPROOF_EMULATION_DIGEST). Two
# builds of the kernels give the same lines if and only if, on these cases, every output and intermediate
# read back is bit for bit the same:
#   bash property_tests/emulation_digest.sh build/release > after.txt; diff before.txt after.txt
set -euo pipefail
build=${1:?usage: emulation_digest.sh BUILD_DIR [SEED]}
seed=${2:-20261129}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for test in $(cd "$build/property_tests" && ls -- *cpu_emulation_test | sort); do
  RC_PARAMS="seed=$seed" DELTAPROOF_EMULATION_DIGEST="$work/$test" "$build/property_tests/$test" >"$work/$test.log" 2>&1 ||
    { echo "emulation_digest: $test failed (log below)" >&2; cat "$work/$test.log" >&2; exit 1; }
  [ -s "$work/$test" ] || { echo "emulation_digest: $test read back no tensor" >&2; exit 1; }
  sed "s|^|$test |" "$work/$test"
done
