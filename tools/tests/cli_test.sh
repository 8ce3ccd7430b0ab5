#!/usr/bin/env bash
# Command-line contract of `deltaproof`: exit codes, one-line errors, parseable JSON.
# Usage: cli_test.sh PATH_TO_DELTAPROOF
source "$(dirname "$0")/cli_expect.sh"

expect_exit 0 --version
grep -qx "deltaproof $(cat "$(dirname "$0")/../../VERSION")" "$out" || fail "--version is not the VERSION file's: $(cat "$out")"
expect_exit 0 verify
grep -q "all forms agree" "$out" || fail "verify does not report agreement"
grep -E "^  output +chunkwise vs parallel +0 +0 " "$out" >/dev/null || fail "verify --scalar exact does not print exact zeros"
expect_exit 0 verify --scalar double --L 33 --C 5
expect_exit 0 verify --scalar float --L 40 --C 64 --dk 1 --dv 3
for form in chunk recurrent parallel; do
  expect_exit 0 gradcheck --form "$form" --L 9 --C 4 --dk 3 --dv 2
  expect_exit 0 gradcheck --form "$form" --L 9 --C 4 --dk 3 --dv 2 --json
  /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pass"] is True and len(d["rows"]) == 4
assert d["deltaproof_version"]' \
    "$out" || fail "gradcheck --form $form --json is not the expected JSON"
done
# Demanding more digits than High's rounding allows (about 1e-100/h = 1e-80 here) must fail:
# the verdict is not constant.
expect_exit 1 gradcheck --L 5 --C 2 --dk 2 --dv 2 --step 1e-20 --digits 90

# Progress on stderr: none for a short command; with DELTAPROOF_PROGRESS_AFTER=0 every step and the total.
expect_exit 0 verify --L 9 --C 4 --dk 3 --dv 2
[ ! -s "$err" ] || fail "a short verify printed progress: $(cat "$err")"
DELTAPROOF_PROGRESS_AFTER=0 expect_exit 0 verify --L 9 --C 4 --dk 3 --dv 2
grep -q "^deltaproof verify --op linear: \[1/3\] forms in exact (" "$err" || fail "no progress line for step 1: $(cat "$err")"
grep -q "^deltaproof verify --op linear: done (" "$err" || fail "no progress total: $(cat "$err")"
grep -q "all forms agree" "$out" || fail "verify with progress does not report agreement on stdout"

expect_bad_input --L verify --L 0
expect_bad_input --C verify --C 0
expect_bad_input --dk verify --dk 257
expect_bad_input --dv gradcheck --dv 1000
expect_bad_input --L verify --L twelve
expect_bad_input --bogus verify --bogus 3
expect_bad_input --scalar verify --scalar quad
expect_bad_input --step gradcheck --step -1
expect_bad_input --form gradcheck --form sideways

# --impl cuda (linear attention): with a device the kernels agree with the oracle; without one
# (CI), or in a build without nvcc, one line naming --impl and exit 2.
# gradcheck's reference default is C = 8, which the kernels reject; without --C, --impl cuda takes 64,
# so the default case runs (with a device: exit 0; without one it gets past the --C check, which
# comes first, to the device check: one line naming --impl, not --C).
if nvidia-smi -L >/dev/null 2>&1; then
  expect_exit 0 verify --impl cuda --L 40 --C 16 --dk 9 --dv 5
  expect_exit 0 gradcheck --impl cuda --L 20 --C 16 --dk 5 --dv 4
  expect_exit 0 gradcheck --impl cuda
  expect_bad_input --C verify --impl cuda --C 8
  expect_bad_input --C gradcheck --impl cuda --C 8
else
  expect_bad_input --impl verify --impl cuda
  expect_bad_input --impl gradcheck --impl cuda
  # A CUDA build without a device: a bad --C is named before the device is looked for.
  if "$bin" verify --impl cuda 2>&1 | grep -q "no CUDA device"; then
    expect_bad_input --C gradcheck --impl cuda --C 8
  fi
fi

finish "cli"
