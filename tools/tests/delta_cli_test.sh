#!/usr/bin/env bash
# Command-line contract of `deltaproof --op delta|gated-delta`: every form agrees, gradients pass,
# bad gate values exit 2 with one line naming the flag.
source "$(dirname "$0")/cli_expect.sh"

for op in delta gated-delta; do
  expect_exit 0 verify --op "$op" --L 21 --C 8 --dk 5 --dv 3
  grep -q "all forms agree" "$out" || fail "verify --op $op does not report agreement"
  grep -q "max|T|" "$out" || fail "verify --op $op has no conditioning section"
  grep -q "T: blocked (16) == forward substitution *exact" "$out" || fail "verify --op $op: no exact WY stage rows"
  expect_exit 0 verify --op "$op" --scalar double --L 19 --C 4 --dk 4 --dv 3 --beta 1
  expect_exit 0 verify --op "$op" --scalar float --L 12 --C 16 --dk 3 --dv 2 --keys unnormalized
  for form in chunk recurrent parallel; do
    expect_exit 0 gradcheck --op "$op" --form "$form" --L 7 --C 3 --dk 3 --dv 2 --json
    /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pass"] is True and d["exact_chunkwise_equals_recurrent"] and d["exact_dual_directional_derivative"]' \
      "$out" || fail "gradcheck --op $op --form $form --json is not the expected JSON"
  done
done
expect_exit 0 verify --op gated-delta --L 9 --C 4 --dk 2 --dv 2 --alpha 1 --beta 0.001

expect_bad_input --beta verify --op delta --beta 1.5
expect_bad_input --beta gradcheck --op gated-delta --beta -0.25
expect_bad_input --beta verify --op delta --beta lots
expect_bad_input --alpha verify --op gated-delta --alpha 0
expect_bad_input --alpha verify --op gated-delta --alpha -1
expect_bad_input --keys verify --op delta --keys huge

# --impl cuda gradcheck (the backward kernel): with a device, the default case and the case L=100 C=64 DK=48 DV=32
# pass (and --json parses); without one, one line naming --impl (the default C = 64 gets past the
# --C check, which comes first) and a bad --C named; in a build without nvcc, one line naming --impl.
for op in delta gated-delta; do
  if nvidia-smi -L >/dev/null 2>&1; then
    expect_exit 0 gradcheck --impl cuda --op "$op"
    expect_exit 0 gradcheck --impl cuda --op "$op" --L 100 --C 64 --dk 48 --dv 32
    expect_exit 0 gradcheck --impl cuda --op "$op" --L 30 --C 16 --dk 7 --dv 5 --json
    /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pass"] is True and d["impl"] == "cuda" and len(d["directional"]) >= 5' \
      "$out" || fail "gradcheck --impl cuda --op $op --json is not the expected JSON"
    expect_bad_input --C gradcheck --impl cuda --op "$op" --C 48
  else
    expect_bad_input --impl gradcheck --impl cuda --op "$op"
    if "$bin" verify --impl cuda --op "$op" 2>&1 | grep -q "no CUDA device"; then
      expect_bad_input --C gradcheck --impl cuda --op "$op" --C 48
    fi
  fi
done

finish "delta cli"
