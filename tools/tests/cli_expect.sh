# The command-line contract tests' harness, sourced by each *_cli_test.sh with the deltaproof
# binary as its first argument: runs it with stdout in $out and stderr in $err, counts failures.
#   expect_exit CODE ARGS...            exit code CODE
#   expect_bad_input FRAGMENTS ARGS...  exit 2, nothing on stdout, one line on stderr holding every
#                                       '|'-separated fragment (the flag, file or tensor it names)
#   finish NAME                         prints the verdict line and exits with it ($dir, the
#                                       scratch folder, goes on any exit)
set -u
bin="$1"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
dir=$(mktemp -d /tmp/deltaproof_cli.XXXXXX)
trap 'rm -rf "$dir"' EXIT
out="$dir/stdout"
err="$dir/stderr"

expect_exit() {
  local code="$1"; shift
  "$bin" "$@" >"$out" 2>"$err"
  local got=$?
  [ "$got" -eq "$code" ] || fail "deltaproof $* exited $got, expected $code: $(head -c 600 "$err") $(head -c 600 "$out")"
}

expect_bad_input() {
  local fragments="$1"; shift
  local command="$*"
  expect_exit 2 "$@"
  [ ! -s "$out" ] || fail "deltaproof $command printed to stdout"
  [ "$(wc -l <"$err")" -eq 1 ] || fail "deltaproof $command printed $(wc -l <"$err") lines on stderr: $(cat "$err")"
  local IFS='|' fragment
  for fragment in $fragments; do
    grep -qF -- "$fragment" "$err" || fail "deltaproof $command: error does not name '$fragment': $(cat "$err")"
  done
}

finish() {
  [ "$failures" -eq 0 ] && echo "$1: all checks passed" || echo "$1: $failures checks failed"
  exit $((failures > 0))
}
