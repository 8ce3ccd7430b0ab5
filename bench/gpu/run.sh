#!/bin/bash
# Every GPU check and benchmark of deltaproof's kernels on one CUDA GPU, from a build tree.
#
#   bash bench/gpu/run.sh [PHASE...]        from the repository root; no phase: suites bench cli
#
# Phases:
#   suites    every GPU test (ctest label exactly gpu: not the sanitizer runs, not the long ones) with CI's seed
#   seeds     each GPU property suite with seeds SEED_FIRST..SEEDS (max_success=4; the accuracy runs at the
#             design shape left out), SEED_JOBS processes at a time
#   sanitize  every GPU test under compute-sanitizer memcheck, racecheck, synccheck, initcheck
#             (ctest label gpu-sanitize)
#   long      the 2^20-token and > 2^31-element runs (ctest label long)
#   multi-gpu the tests over several GPUs (ctest label multi-gpu; they skip with fewer than two; a pack
#             made with MULTI_GPU=1)
#   bench     bench_linear_attention_cuda and bench_delta_rule_cuda: Google Benchmark JSON, its
#             provenance (date, commit, GPU, versions, command) put first by bench/provenance.py
#   cli       deltaproof verify and gradcheck --impl cuda for every op, default and odd shapes
#
# Settings (environment, defaults in brackets):
#   BUILD_DIR [build/release]  a CUDA build (cmake --preset release with nvcc on PATH), or one
#                              unpacked by `bash bench/gpu/pack.sh --unpack`
#   OUT       [BUILD_DIR/gpu_out]  logs and JSON
#   CI_SEED   [20261129]       RC_PARAMS seed of the suites phase (the one CI uses)
#   SEEDS     [20]             seeds SEED_FIRST..SEEDS in the seeds phase
#   SEED_FIRST [1]             the first seed of the seeds phase
#   SEED_JOBS [6]              seeds phase: processes at a time per suite
#   JOBS      [$(nproc)]       ctest -j for suites, sanitize and long
#   BENCH_ARGS []              extra arguments to both benchmarks (e.g. --benchmark_filter=Forward)
# Exit status: non-zero if any phase failed; a summary of each phase is printed.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD_DIR_ARG=${BUILD_DIR:-build/release}
BUILD_DIR=$(realpath -m "$BUILD_DIR_ARG")
OUT=$(realpath -m "${OUT:-$BUILD_DIR/gpu_out}")
CI_SEED=${CI_SEED:-20261129}
SEEDS=${SEEDS:-20}
SEED_FIRST=${SEED_FIRST:-1}
SEED_JOBS=${SEED_JOBS:-6}
JOBS=${JOBS:-$(nproc)}
[ -d "$BUILD_DIR/property_tests" ] || { echo "run.sh: $BUILD_DIR/property_tests does not exist (BUILD_DIR)" >&2; exit 2; }
phases=("$@")
[ ${#phases[@]} = 0 ] && phases=(suites bench cli)
for phase in "${phases[@]}"; do
  case $phase in
    suites|seeds|sanitize|long|multi-gpu|bench|cli) ;;
    *) echo "run.sh: unknown phase $phase (suites seeds sanitize long multi-gpu bench cli)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
[ -d "$BUILD_DIR/packed_libs" ] && export LD_LIBRARY_PATH="$BUILD_DIR/packed_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! command -v compute-sanitizer >/dev/null && [ -d /usr/local/cuda/bin ]; then export PATH="$PATH:/usr/local/cuda/bin"; fi

failed=0
note() { echo "== $*"; }
check() { [ "$1" = 0 ] || failed=1; }
gpu_suites() { (cd "$BUILD_DIR/property_tests" && ls *_gpu_test 2>/dev/null | grep -v '^long_'); }

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$OUT/gpu.txt"
note "GPU: ${gpu_name:-none found}; build: $BUILD_DIR; output: $OUT"

phase_suites() {
  RC_PARAMS="seed=$CI_SEED" ctest --test-dir "$BUILD_DIR" -L '^gpu$' -LE 'long|multi-gpu' -j "$JOBS" --timeout 600 \
    --output-on-failure > "$OUT/suites.txt" 2>&1
  local rc=$?; check $rc
  note "suites (RC_PARAMS=seed=$CI_SEED): rc=$rc, $(grep -E 'tests passed|tests failed' "$OUT/suites.txt")"
}

phase_seeds() {
  local t
  for t in $(gpu_suites); do
    seq "$SEED_FIRST" "$SEEDS" | xargs -P "$SEED_JOBS" -I{} sh -c "RC_PARAMS='seed={} max_success=4' \
      '$BUILD_DIR/property_tests/$t' --gtest_color=no --gtest_filter='-*AccuracyAtDesign*' \
      > '$OUT/seed_${t}_{}.log' 2>&1; echo $t seed {} rc=\$?"
  done > "$OUT/seeds.txt"
  for t in $(gpu_suites); do note "seeds $t: $(grep "^$t " "$OUT/seeds.txt" | grep -c 'rc=0$') of seeds $SEED_FIRST..$SEEDS pass"; done
  if grep -v 'rc=0$' "$OUT/seeds.txt"; then failed=1; fi
  grep -h -B2 -A6 "Falsifiable\|Failure" "$OUT"/seed_*.log 2>/dev/null | cut -c1-240 | head -40
}

phase_sanitize() {
  ctest --test-dir "$BUILD_DIR" -L gpu-sanitize -j "$JOBS" --timeout 600 > "$OUT/sanitize.txt" 2>&1
  local rc=$? tool; check $rc
  for tool in memcheck racecheck synccheck initcheck; do
    note "$tool: $(grep -cE "sanitize\.$tool\..* Passed" "$OUT/sanitize.txt") passed of $(grep -cE "Test +#[0-9]+: sanitize\.$tool\." "$OUT/sanitize.txt")"
  done
  grep -hE "tests passed|tests failed|\*\*\*|Not Run" "$OUT/sanitize.txt" | head -20
}

phase_long() {
  ctest --test-dir "$BUILD_DIR" -L long -j "$JOBS" --timeout 600 --output-on-failure > "$OUT/long.txt" 2>&1
  local rc=$?; check $rc
  note "long: rc=$rc, $(grep -E 'tests passed|tests failed' "$OUT/long.txt")"
}

phase_multi-gpu() {
  NCCL_NVLS_ENABLE=0 ctest --test-dir "$BUILD_DIR" -L multi-gpu --timeout 600 --output-on-failure > "$OUT/multi_gpu.txt" 2>&1
  local rc=$?; check $rc
  note "multi-gpu: rc=$rc, $(grep -E 'tests passed|tests failed' "$OUT/multi_gpu.txt")"
}

phase_bench() {
  # The provenance (date, commit, GPU, versions, this command) goes first in each JSON (bench/provenance.py).
  local b rc name driver nvcc
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  nvcc=$(sed -n 's/^set(CMAKE_CUDA_COMPILER_VERSION "\(.*\)")/\1/p' "$BUILD_DIR"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1)
  for b in bench_linear_attention_cuda bench_delta_rule_cuda; do
    name=${b#bench_}
    "$BUILD_DIR/bench/$b" --benchmark_out="$OUT/$name.json" --benchmark_out_format=json ${BENCH_ARGS:-} \
      > "$OUT/$name.txt" 2>&1
    rc=$?; check $rc
    note "$b: rc=$rc, $OUT/$name.json"
    if [ -s "$OUT/$name.json" ] && command -v python3 >/dev/null; then
      python3 "$ROOT/bench/provenance.py" "$OUT/$name.json" \
        --command "$BUILD_DIR_ARG/bench/$b --benchmark_out=$name.json --benchmark_out_format=json${BENCH_ARGS:+ $BENCH_ARGS}" \
        --version "nvidia_driver=${driver:-not recorded}" --version "cuda_toolkit=${nvcc:-not recorded}" || failed=1
    fi
    grep -E "_median" "$OUT/$name.txt" | awk '{print $1, $2, $3}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'
  done
}

phase_cli() {
  local op args rc
  for op in linear delta gated-delta; do
    for args in "verify --impl cuda --op $op" "verify --impl cuda --op $op --L 100 --C 64 --dk 48 --dv 32 --seed 3" \
                "gradcheck --impl cuda --op $op" "gradcheck --impl cuda --op $op --L 100 --C 64 --dk 48 --dv 32"; do
      echo "== deltaproof $args"
      "$BUILD_DIR/tools/deltaproof" $args 2>&1 | tail -25
      rc=${PIPESTATUS[0]}; echo "exit $rc"; check $rc
      echo "deltaproof $args: exit $rc" >> "$OUT/cli_exits.txt"
    done
  done > "$OUT/cli.txt"
  cat "$OUT/cli_exits.txt"; rm -f "$OUT/cli_exits.txt"
}

for phase in "${phases[@]}"; do
  start=$(date +%s); "phase_$phase"; note "$phase: $(( $(date +%s) - start )) s"
done
exit $failed
