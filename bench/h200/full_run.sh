#!/bin/bash
# Every GPU check and benchmark of the DeltaNet, Gated DeltaNet and linear attention kernels on the
# H200, in two device calls. Builds nothing: `bash bench/h200/pack.sh` here (after `cmake --build
# --preset release`) packs the binaries with the build's ctest files, keeping their paths under the
# checkout, into .dev-pack/run.tar.xz; on the device, unpacked at /tmp/r (this script with them):
#   bash /tmp/r/bench/h200/full_run.sh measure    # ≤ 9 min: suites and 20 seeds, benchmarks, ncu, CLI
#   bash /tmp/r/bench/h200/full_run.sh sanitize   # ≈ 9 min: ctest -L gpu-sanitize and ctest -L long
#   bash /tmp/r/bench/h200/full_run.sh seeds BINARY[:FILTER]...  # 20 seeds of those suites, nothing beside
# Logs under $OUT; a short summary is printed last.
set -u
ROOT=/tmp/r
. "$ROOT/source.sh"; SRC=$DELTAPROOF_BUILD_SOURCE  # the checkout path the ctest files name
mkdir -p "$(dirname "$SRC")" && ln -sfn "$ROOT" "$SRC"
B=$ROOT/build/release
export LD_LIBRARY_PATH=$ROOT/lib:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/full_run_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > "$OUT/gpu.txt" 2>&1
cd "$B/property_tests"
summary() { grep -hE "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|accuracy|Failure|exception|OUTSIDE" "$@" | cut -c1-260 | head -40; }

if [ "${1:-}" = measure ]; then
  # 1. Every GPU suite once with CI's seed and, beside them, the property tests with seeds 1..20 (every
  #    test but the DESIGN-shape accuracy runs; 6 processes per binary at a time): ≤ 240 s.
  for t in delta_rule_gpu_test delta_rule_backward_gpu_test delta_rule_strides_gpu_test bad_inputs_gpu_test \
           linear_attention_gpu_test kernel_size_limits_test; do
    (RC_PARAMS="seed=20261129" timeout 240 ./$t --gtest_color=no > "$OUT/suite_$t.log" 2>&1; echo "$t rc=$?") &
  done > "$OUT/suites.txt"
  seeds() {  # binary filter
    seq 1 20 | xargs -P 6 -I{} sh -c "RC_PARAMS='seed={} max_success=4' timeout 55 ./$1 --gtest_color=no \
      --gtest_filter='$2' > $OUT/seed_$1_{}.log 2>&1; echo $1 seed {} rc=\$?"
  }
  { seeds delta_rule_backward_gpu_test '-*AccuracyAtDesign*' &
    seeds delta_rule_gpu_test '-*AccuracyAtDesign*' &
    seeds linear_attention_gpu_test '-*AccuracyAtDesign*' & wait; } > "$OUT/seeds.txt"
  wait
  # 2. Benchmarks alone on the GPU (medians of 60, CUDA events).
  timeout 120 "$B/bench/bench_delta_rule_cuda" \
    --benchmark_filter='BM_DeltaRule(Backward|ForwardBackward|Forward/|WyPrepare|Decode)' \
    --benchmark_out="$OUT/bench_delta.json" --benchmark_out_format=json > "$OUT/bench_delta.txt" 2>&1
  echo "bench delta rc=$?" >> "$OUT/suites.txt"
  # 3. Where the scans' time goes: one launch each of the state pass, the gradient scan and the chunk
  #    gradients at C = 64 (ungated), hardware counters.
  for k in chunk_scan_registers_kernel gradient_scan_registers_kernel chunk_gradients_kernel; do
    timeout 40 ncu --clock-control none -k "regex:$k" -c 1 --launch-skip 3 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
      --section LaunchStats --section SchedulerStats \
      "$B/bench/bench_delta_rule_cuda" --benchmark_filter='BM_DeltaRuleBackward/C:64/gated:0' \
      --benchmark_repetitions=1 >> "$OUT/ncu.txt" 2>&1
  done
  # 4. Gradient checks from the command line (issue 11's cases).
  for op in delta gated-delta; do
    timeout 30 "$B/tools/deltaproof" gradcheck --impl cuda --op $op > "$OUT/cli.txt.$op" 2>&1; echo "gradcheck $op default rc=$?"
    timeout 30 "$B/tools/deltaproof" gradcheck --impl cuda --op $op --L 100 --C 64 --dk 48 --dv 32 >> "$OUT/cli.txt.$op" 2>&1
    echo "gradcheck $op --L 100 --C 64 --dk 48 --dv 32 rc=$?"
  done >> "$OUT/suites.txt"
  cat "$OUT"/cli.txt.* > "$OUT/cli.txt"; rm -f "$OUT"/cli.txt.*
  for t in delta_rule_backward_gpu_test delta_rule_gpu_test linear_attention_gpu_test; do
    echo "seeds $t: $(grep "^$t" "$OUT/seeds.txt" | grep -c 'rc=0')/20 pass"
  done >> "$OUT/suites.txt"
  grep -h -B2 -A6 "Falsifiable\|Failure" "$OUT"/seed_*.log | cut -c1-260 | head -60 > "$OUT/seed_failures.txt"
  grep -v "rc=0" "$OUT/seeds.txt" >> "$OUT/suites.txt"; rm -f "$OUT/seeds.txt"
  tar -czf "$OUT/seed_logs.tgz" -C "$OUT" $(cd "$OUT" && ls seed_*.log) && rm -f "$OUT"/seed_*.log
  tar -czf "$OUT/suite_logs.tgz" -C "$OUT" $(cd "$OUT" && ls suite_*.log)
  summary "$OUT"/suite_*.log; rm -f "$OUT"/suite_*.log
  grep -E "_median" "$OUT/bench_delta.txt" | awk '{print $1, $2, $3}' | sed 's/_median//; s|/iterations:1/repeats:60/manual_time||'
  rm -f "$OUT/bench_delta.txt"  # the JSON holds it (only 8 files come back from a device call)
  head -40 "$OUT/seed_failures.txt"
  cat "$OUT/suites.txt"
elif [ "${1:-}" = seeds ]; then
  # Property suites with seeds 1..20 alone on the machine (8 processes per binary at a time; in `measure`
  # they share it with everything else and may time out). Arguments: BINARY[:GTEST_FILTER] ...; each
  # process gets ${SEED_TIMEOUT:-170} s.
  shift
  for arg in "$@"; do
    t=${arg%%:*}; filter=-*AccuracyAtDesign*; [ "$arg" != "$t" ] && filter=${arg#*:}
    seq 1 20 | xargs -P ${SEED_PARALLEL:-8} -I{} sh -c "RC_PARAMS='seed={} max_success=4' timeout ${SEED_TIMEOUT:-170} ./$t --gtest_color=no \
      --gtest_filter='$filter' > $OUT/seed_${t}_{}.log 2>&1; echo $t seed {} rc=\$?" &
  done > "$OUT/seeds.txt"
  wait
  for arg in "$@"; do t=${arg%%:*}; echo "seeds $t: $(grep "^$t" "$OUT/seeds.txt" | grep -c 'rc=0')/20 pass"; done
  grep -v "rc=0" "$OUT/seeds.txt"
  grep -h -B2 -A6 "Falsifiable\|Failure" "$OUT"/seed_*.log | cut -c1-260 | head -60
  tar -czf "$OUT/seed_logs.tgz" -C "$OUT" $(cd "$OUT" && ls seed_*.log) && rm -f "$OUT"/seed_*.log
elif [ "${1:-}" = sanitize ]; then
  # Every device test under memcheck, racecheck, synccheck and initcheck (max_success=3), beside the
  # 2²⁰-token / > 2³¹-element runs.
  (timeout 300 ctest --test-dir "$B/property_tests" -L long --output-on-failure > "$OUT/long.txt" 2>&1; echo "long rc=$?" >> "$OUT/long.txt") &
  timeout ${SANITIZE_TIMEOUT:-540} ctest --test-dir "$B/property_tests" -L gpu-sanitize -j 14 --timeout 400 > "$OUT/sanitize.txt" 2>&1
  echo "sanitize rc=$?"
  wait
  for tool in memcheck racecheck synccheck initcheck; do
    echo "$tool: $(grep -E "Test +#[0-9]+: sanitize\.$tool\." "$OUT/sanitize.txt" | grep -c " Passed ") passed of $(grep -cE "Test +#[0-9]+: sanitize\.$tool\." "$OUT/sanitize.txt") run"
  done
  grep -hE "tests passed|Failed|\*\*\*|Timeout|Not Run" "$OUT/sanitize.txt" | head -30
  sort -t' ' -k1 "$OUT/sanitize.txt" | grep -E " Passed " | awk '{print $(NF-1), $4}' | sort -rn | head -5  # slowest
  tail -25 "$OUT/long.txt"
fi
cat "$OUT/gpu.txt"; rm -f "$OUT/gpu.txt"
