"""What check_kernel's cases cover, measured: every pair of values of two case attributes (dtype ×
h0, dtype × varlen, regime × C, C × length class, gradients × h0, head dims × dtype, scale mode ×
dtype, …) occurs within the default number of cases, for each op, at the default arguments and at
narrower lists a user may pass; the draws are a pure function of the seed. Read off the cases'
fields, not off the design that drew them."""
import math

import numpy as np
import pytest

from deltaproof import check
from deltaproof.check import DEFAULT_MAX_CASES, attribute_domains, draw_cases, pair_coverage
from deltaproof.dtypes import round_to

SEEDS = range(4)

NARROWER = {
    "bf16 only": dict(dtypes=("bf16",)),
    "fp32 only, C = 64": dict(dtypes=("fp32",), chunk_sizes=(64,)),
    "fla's head dims": dict(head_dims=((64, 64), (60, 100)), chunk_sizes=(64,)),
    "three dtypes": dict(dtypes=("bf16", "fp16", "fp32")),
    "forward, fixed length, no h0": dict(backward=False, varlen=False, initial_state=False),
    "the kernel's default scale": dict(scale=None),
    "a fixed scale": dict(scale=0.125),
    "beta near one and normal": dict(regimes=("normal", "beta_one")),
}


def _measured(op, seed=0, **kwargs):
    cases = draw_cases(op, seed=seed, **kwargs)
    domain_args = {k: kwargs[k] for k in ("dtypes", "chunk_sizes", "head_dims", "regimes", "scale", "backward",
                                          "varlen", "initial_state") if k in kwargs}
    domains = attribute_domains(op, **domain_args)
    return cases, domains, pair_coverage(cases, domains, kwargs.get("head_dims"))


def _first_full(cases, domains, head_dims=None):
    """How many cases it takes to cover every pair."""
    total = pair_coverage(cases, domains, head_dims)[1]
    for n in range(1, len(cases) + 1):
        if pair_coverage(cases[:n], domains, head_dims)[0] == total:
            return n
    return None


@pytest.mark.parametrize("op", check.OPS)
@pytest.mark.parametrize("seed", SEEDS)
def test_every_pair_is_covered_at_the_defaults(op, seed):
    cases, domains, (covered, total, missing) = _measured(op, seed)
    assert len(cases) == DEFAULT_MAX_CASES
    assert covered == total, f"{op} seed {seed}: {covered}/{total}, missing {missing[:8]}"
    print(f"{op} seed {seed}: {covered}/{total} pairs, all covered by case {_first_full(cases, domains)}")


@pytest.mark.parametrize("name", sorted(NARROWER))
@pytest.mark.parametrize("op", check.OPS)
def test_every_pair_is_covered_for_narrower_lists(op, name):
    kwargs = NARROWER[name]
    cases, domains, (covered, total, missing) = _measured(op, 3, **kwargs)
    assert covered == total, f"{op} {name}: {covered}/{total}, missing {missing[:8]}"
    print(f"{op} {name}: {covered}/{total} pairs, all covered by case "
          f"{_first_full(cases, domains, kwargs.get('head_dims'))}")


@pytest.mark.parametrize("op", check.OPS)
def test_domains_hold_what_the_arguments_promise(op):
    d = attribute_domains(op)
    assert set(d["dtype"]) == {"bf16", "fp32"} and set(d["chunk_size"]) == {16, 32, 64}
    assert set(d["length"]) == {"1", "2", "3..8", "C-1", "C", "C+1", "2C+3", "8C+5"}
    assert set(d["scale"]) == {"one", "inv_sqrt_k", "random", "default"}
    assert set(d["h0"]) == set(d["varlen"]) == {False, True}
    assert set(d["gradients"]) == {"forward", "backward", "backward+dht"}
    assert set(d["key_dim"]) == set(d["value_dim"]) == {"1", "ragged", "pow2", "256"}
    assert ("beta" in d) == (op != "linear") and ("gates" in d) == (op == "gated-delta")
    if op == "gated-delta":
        assert set(d["beta"]) == {"normal", "beta_small", "beta_one"}
        assert set(d["gates"]) == {"normal", "gates_very_negative"}
    narrow = attribute_domains(op, dtypes=("bf16",), scale=None, backward=False)
    assert narrow["dtype"] == ("bf16",) and narrow["scale"] == ("default",) and narrow["gradients"] == ("forward",)


def test_the_combinations_that_lock_step_rotation_never_drew():
    """Read directly off Case fields, one combination per finding."""
    def some(cases, test):
        return any(test(c) for c in cases)

    for seed in SEEDS:
        gated = draw_cases("gated-delta", seed=seed)
        linear = draw_cases("linear", seed=seed)
        for dtype in ("bf16", "fp32"):
            assert some(gated, lambda c: c.dtype == dtype and c.h0), (seed, dtype, "h0")
            assert some(gated, lambda c: c.dtype == dtype and not c.h0), (seed, dtype, "no h0")
            assert some(gated, lambda c: c.dtype == dtype and c.varlen), (seed, dtype, "varlen")
            assert some(gated, lambda c: c.dtype == dtype and c.scale_mode == "default"), (seed, dtype)
        for C in (16, 32, 64):
            assert some(gated, lambda c: c.chunk_size == C and "gates_very_negative" in c.regimes), (seed, C)
            assert some(gated, lambda c: c.chunk_size == C and c.varlen), (seed, C, "varlen")
            for length in ("1", "2", "C-1", "C", "C+1", "2C+3", "8C+5"):
                assert some(linear, lambda c: c.chunk_size == C and c.length_class == length), (seed, C, length)
        assert some(gated, lambda c: c.scale_mode == "default" and c.key_dim != c.value_dim), seed
        assert some(gated, lambda c: c.h0 and c.backward and c.dht), seed
        assert some(gated, lambda c: c.scale_mode in ("random", "inv_sqrt_k") and c.kernel_scale != 1), seed


@pytest.mark.parametrize("op", check.OPS)
def test_sixteen_bit_cases_span_many_chunks(op):
    """A kernel whose running state is kept in bf16 shows only over many chunks."""
    for seed in SEEDS:
        for dtypes in (("bf16", "fp32"), ("bf16",), ("fp16", "bf16", "fp32")):
            cases = draw_cases(op, seed=seed, dtypes=dtypes)
            for dtype in set(dtypes) - {"fp32"}:
                assert any(c.dtype == dtype and max(c.lengths) >= 8 * c.chunk_size + 5 for c in cases), \
                    (op, seed, dtypes, dtype)


def test_draws_are_a_pure_function_of_the_seed():
    a, b = draw_cases("delta", seed=7), draw_cases("delta", seed=7)
    assert a == b
    assert draw_cases("delta", seed=8) != a
    assert [c.describe() for c in draw_cases("delta", seed=7, max_cases=12)] == [c.describe() for c in a[:12]]


def test_length_classes_and_scales_are_what_the_case_says():
    for case in draw_cases("gated-delta", seed=1) + draw_cases("linear", seed=2, dtypes=("fp16",)):
        C = case.chunk_size
        expected = {"1": 1, "2": 2, "C-1": C - 1, "C": C, "C+1": C + 1, "2C+3": 2 * C + 3, "8C+5": 8 * C + 5}
        if case.length_class == "3..8":
            assert any(3 <= n <= 8 for n in case.lengths)
        else:
            assert expected[case.length_class] in case.lengths, case.describe()
        if case.varlen:
            assert 0 in case.lengths and 1 in case.lengths and case.batch == 1
        K = case.key_dim
        if case.scale_mode == "default":
            assert case.kernel_scale is None and case.judged_scale == K ** -0.5
        elif case.scale_mode == "inv_sqrt_k":
            assert case.kernel_scale == case.judged_scale == K ** -0.5
        elif case.scale_mode == "one":
            assert case.kernel_scale == 1.0
        else:
            s = case.kernel_scale
            assert s != 1 and 1 / 16 <= s < 2 and float(round_to(np.array([s]), "bf16")[0]) == s
            assert math.isfinite(case.judged_scale)
