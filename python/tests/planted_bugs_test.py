"""A test must be able to fail: six planted bugs in a numpy float32 kernel, each caught by
check_kernel and shrunk to a case of a few tokens; the same kernel without its bug passes."""
import pytest

import deltaproof
from numpy_kernels import numpy_kernel

# (bug, op, dtypes, smallest tokens the bug can show at)
PLANTED = [
    ("mask_off_by_one", "linear", ("bf16", "fp32"), 1),
    ("drop_partial_chunk", "delta", ("bf16", "fp32"), 1),
    ("lose_h0", "gated-delta", ("bf16", "fp32"), 1),
    ("no_varlen_reset", "linear", ("bf16", "fp32"), 0),  # two empty sequences suffice when h0 is given
    ("gate_wrong_token", "gated-delta", ("bf16", "fp32"), 2),
    ("bf16_state", "delta", ("fp32",), 1),
]


@pytest.mark.parametrize("bug,op,dtypes,fewest", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bug_is_caught_and_shrunk(bug, op, dtypes, fewest):
    report = deltaproof.check_kernel(numpy_kernel(bug), op=op, dtypes=dtypes, max_cases=12, seed=11,
                                     backward=False, stop_on_failure=True)
    assert not report.passed, f"{bug} was not caught:\n{report}"
    cx = report.counterexample
    assert cx is not None and not cx.passed
    assert fewest <= cx.case.tokens <= 4, f"{bug}: shrunk case still has {cx.case.tokens} tokens:\n{report}"
    assert cx.case.heads == 1 and cx.case.key_dim <= 2 and cx.case.value_dim <= 2, cx.case.describe()
    assert cx.verdict is not None and not cx.verdict.agrees
    if bug == "no_varlen_reset":  # needs a second sequence: either its own h0 or its tokens see the first's state
        assert cx.case.varlen and len(cx.case.lengths) == 2
    if bug == "lose_h0":
        assert cx.case.h0


@pytest.mark.parametrize("op", ["linear", "delta", "gated-delta"])
def test_the_same_kernel_without_bugs_passes_those_cases(op):
    report = deltaproof.check_kernel(numpy_kernel(), op=op, dtypes=("bf16", "fp32"), max_cases=12, seed=11,
                                     backward=False)
    assert report.passed, str(report)
