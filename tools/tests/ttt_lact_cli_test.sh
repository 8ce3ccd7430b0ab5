#!/usr/bin/env bash
# Command-line contract of `deltaproof verify --op ttt|lact` and `deltaproof masks`.
# Usage: ttt_lact_cli_test.sh PATH_TO_DELTAPROOF
source "$(dirname "$0")/cli_expect.sh"

expect_exit 0 verify --op ttt --L 13 --C 4 --dk 3 --dv 2
grep -q "all TTT equivalences hold" "$out" || fail "verify --op ttt does not report agreement"
grep -E "^  output +GD 1/2\|Sk-v\|\^2 vs DeltaNet +0 +0 " "$out" >/dev/null || fail "verify --op ttt: no exact DeltaNet row"
expect_exit 0 verify --op lact --L 13 --C 4 --dk 3 --dv 2
grep -q "all LaCT equivalences hold" "$out" || fail "verify --op lact does not report agreement"

# Shifted LaCT + window: W >= C leaves no causal gap, W < C leaves the named one.
expect_exit 0 masks --schedule apply-update --L 8 --C 4 --window 2 --fast-weight swiglu
grep -q "causal gaps (j <= i not influencing i): (2,0) (3,0) (3,1) (6,4) (7,4) (7,5)$" "$out" || fail "masks W=2 < C=4: gap not named"
grep -q "measured mask equals the prediction" "$out" || fail "masks W=2: measured differs"
expect_exit 0 masks --schedule apply-update --L 8 --C 4 --window 4
grep -q "causal gaps (j <= i not influencing i): none" "$out" || fail "masks W=C=4 leaves a causal gap"
for s in update-apply apply-update single; do
  expect_exit 0 masks --schedule "$s" --L 7 --C 3
  grep -q "exactly nonzero Jacobian blocks over Q" "$out" || fail "masks --schedule $s: not measured over Q"
done

expect_bad_input --C verify --op ttt --C 0
expect_bad_input --C masks --C 0
expect_bad_input --window masks --window -1
expect_bad_input --schedule masks --schedule sideways
expect_bad_input --fast-weight masks --fast-weight mlp
expect_bad_input --L masks --L 0
expect_bad_input --scalar verify --op ttt --scalar double
expect_bad_input --op gradcheck --op lact

finish "cli ttt/lact"
