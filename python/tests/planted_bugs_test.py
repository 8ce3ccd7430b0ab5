"""A test must be able to fail. Six bugs planted in a numpy float32 kernel, each caught by
check_kernel and shrunk to a case of a few tokens; six more that only a combination of case
attributes shows (a scale ≠ 1, the kernel's default scale with DK ≠ DV, a 16-bit running state,
fp32 with h0, C = 64, a wrong dh0), each caught at check_kernel's defaults, shrunk to a case that
holds that combination, and passed once the combination is not drawn. The same kernels without
their bugs pass at the defaults over several seeds."""
import pytest

import deltaproof
from numpy_kernels import numpy_kernel
from planted_kernels import dh0_without_dht_kernel, faithful_kernel, planted_kernel

# (bug, op, dtypes, smallest tokens the bug can show at)
PLANTED = [
    ("mask_off_by_one", "linear", ("bf16", "fp32"), 1),
    ("drop_partial_chunk", "delta", ("bf16", "fp32"), 1),
    ("lose_h0", "gated-delta", ("bf16", "fp32"), 0),  # an empty sequence: ht must be h0
    ("no_varlen_reset", "linear", ("bf16", "fp32"), 0),  # two empty sequences suffice when h0 is given
    # fp32: in bf16 the WY chunkwise bounds leave the wrong gate hidden on the smallest shapes, so a bf16 failure
    # shrinks no further than H = 2, DK = 256 (caught all the same: test_a_wrong_token_gate_is_caught_in_bf16_alone).
    ("gate_wrong_token", "gated-delta", ("fp32",), 2),
    ("bf16_state", "delta", ("fp32",), 1),
]


@pytest.mark.parametrize("bug,op,dtypes,fewest", PLANTED, ids=[p[0] for p in PLANTED])
def test_planted_bug_is_caught_and_shrunk(bug, op, dtypes, fewest):
    report = deltaproof.check_kernel(numpy_kernel(bug), op=op, dtypes=dtypes, max_cases=12, seed=11,
                                     backward=False, stop_on_failure=True)
    assert not report.passed, f"{bug} was not caught:\n{report}"
    cx = report.counterexample
    assert cx is not None and cx.status == "disagree"
    assert fewest <= cx.case.tokens <= 4, f"{bug}: shrunk case still has {cx.case.tokens} tokens:\n{report}"
    assert cx.case.heads == 1 and cx.case.key_dim <= 2 and cx.case.value_dim <= 2, cx.case.describe()
    assert cx.verdict is not None and not cx.verdict.agrees
    if bug == "no_varlen_reset":  # needs a second sequence: either its own h0 or its tokens see the first's state
        assert cx.case.sequences == 2
    if bug == "lose_h0":
        assert cx.case.h0


def test_a_wrong_token_gate_is_caught_in_bf16_alone():
    report = deltaproof.check_kernel(numpy_kernel("gate_wrong_token"), op="gated-delta", dtypes=("bf16",),
                                     max_cases=12, seed=11, backward=False, stop_on_failure=True,
                                     shrink_failures=False)
    assert not report.passed, str(report)


def _small(case, tokens=4, dims=2):
    return case.tokens <= tokens and case.heads == 1 and case.key_dim <= dims and case.value_dim <= dims


def _shows_only_where(case, bug):
    """The combination of attributes the bug needs, read off the shrunk case."""
    if bug == "scale_on_keys":
        return case.kernel_scale != 1 and _small(case)
    if bug == "default_scale_from_value_dim":
        return case.scale_mode == "default" and case.key_dim != case.value_dim and _small(case)
    if bug == "state_in_input_dtype":
        return case.dtype in ("bf16", "fp16") and _small(case)
    if bug == "h0_untransposed_in_fp32":
        return case.dtype == "fp32" and case.h0 and _small(case)
    if bug == "gates_restart_at_32":  # a chunk of more than 32 tokens
        return case.chunk_size == 64 and 32 < case.total_length <= 34 and _small(case, tokens=34, dims=1)
    raise ValueError(bug)


# (bug, op, settings under which the combination is never drawn: the bug then passes)
COMBINATIONS = [
    ("scale_on_keys", "delta", dict(scale=1.0)),
    ("default_scale_from_value_dim", "linear", dict(scale=0.25)),
    ("state_in_input_dtype", "gated-delta", dict(dtypes=("fp32",))),
    ("h0_untransposed_in_fp32", "gated-delta", dict(dtypes=("bf16",))),
    ("gates_restart_at_32", "gated-delta", dict(chunk_sizes=(16, 32))),
]


@pytest.mark.parametrize("bug,op,unseen", COMBINATIONS, ids=[c[0] for c in COMBINATIONS])
def test_a_bug_of_one_combination_is_caught_at_the_defaults(bug, op, unseen):
    kernel = planted_kernel(bug)
    report = deltaproof.check_kernel(kernel, op=op, stop_on_failure=True)
    assert not report.passed, f"{bug} was not caught:\n{report}"
    cx = report.counterexample
    assert cx.status == "disagree" and report.shrink_steps > 0 and report.shrink_stopped_by is None, str(report)
    assert _shows_only_where(cx.case, bug), f"{bug}: shrunk to {cx.case.describe()}\n{report}"
    control = deltaproof.check_kernel(kernel, op=op, max_cases=16, **unseen)
    assert control.passed, f"{bug} shows outside its combination:\n{control}"


@pytest.mark.parametrize("op", ["delta", "gated-delta"])
def test_a_sixteen_bit_running_state_is_caught_in_bf16_cases_alone(op):
    report = deltaproof.check_kernel(planted_kernel("state_in_input_dtype"), op=op, dtypes=("bf16",),
                                     stop_on_failure=True)
    assert not report.passed, str(report)
    assert _shows_only_where(report.counterexample.case, "state_in_input_dtype"), str(report)


# Linear attention's running state is held to its own fp32 arithmetic (no operand rounding reaches it:
# proofs/kernel_error_bounds.md §6), so a 16-bit state shows in ht from its first rounding on.
def test_a_sixteen_bit_running_state_in_linear_attention_is_caught():
    report = deltaproof.check_kernel(planted_kernel("state_in_input_dtype"), op="linear", dtypes=("bf16",),
                                     stop_on_failure=True)
    assert not report.passed, str(report)
    cx = report.counterexample
    assert cx.status == "disagree" and "ht" in cx.verdict.failing(), str(report)
    assert _shows_only_where(cx.case, "state_in_input_dtype"), str(report)


@pytest.mark.parametrize("op", ["linear", "delta", "gated-delta"])
def test_a_sixteen_bit_running_state_is_caught_at_every_seed(op):
    missed = [seed for seed in range(6)
              if deltaproof.check_kernel(planted_kernel("state_in_input_dtype"), op=op, dtypes=("bf16",), seed=seed,
                                         stop_on_failure=True, shrink_failures=False).passed]
    assert not missed, missed


@pytest.mark.parametrize("op", ["linear", "delta", "gated-delta"])
def test_a_declared_sixteen_bit_state_is_judged_as_one(op):
    report = deltaproof.check_kernel(planted_kernel("state_in_input_dtype"), op=op, dtypes=("bf16",),
                                     state_dtype="bf16")
    assert report.passed, str(report)


def test_a_wrong_dh0_is_caught_at_the_defaults():
    kernel = dh0_without_dht_kernel()
    report = deltaproof.check_kernel(kernel, op="gated-delta", stop_on_failure=True)
    assert not report.passed, str(report)
    cx = report.counterexample
    assert cx.verdict.failing() == ["dh0"], str(report)
    assert cx.case.backward and cx.case.dht and cx.case.h0 and _small(cx.case, tokens=1, dims=1), str(report)
    for unseen in (dict(backward=False), dict(initial_state=False)):
        control = deltaproof.check_kernel(kernel, op="gated-delta", max_cases=16, **unseen)
        assert control.passed, str(control)


@pytest.mark.parametrize("op,seed", [(op, seed) for op in ("linear", "delta", "gated-delta") for seed in (0, 5)])
def test_the_same_kernels_without_bugs_pass_at_the_defaults(op, seed):
    report = deltaproof.check_kernel(faithful_kernel(), op=op, seed=seed)
    assert report.passed, str(report)
    assert report.coverage[0] == report.coverage[1]


@pytest.mark.parametrize("op", ["linear", "delta", "gated-delta"])
def test_the_forward_kernel_without_bugs_passes_those_cases(op):
    report = deltaproof.check_kernel(numpy_kernel(), op=op, dtypes=("bf16", "fp32"), max_cases=12, seed=11,
                                     backward=False)
    assert report.passed, str(report)
