"""The bound oracle forms: exact results as Fractions equal across forms (==), double and High
agree with them, inputs given as Fractions or floats, and bf16 rounding is exact RNE."""
from fractions import Fraction

import numpy as np
import pytest

import deltaproof
from deltaproof import delta_rule, gated_delta_rule, linear_attention

rng = np.random.default_rng(7)


def dyadic(shape, denominator=4):
    return rng.integers(-4, 5, size=shape) / denominator


L, DK, DV = 7, 3, 2
q, k, v = dyadic((L, DK)), dyadic((L, DK)), dyadic((L, DV))
h0, do, dht = dyadic((DV, DK)), dyadic((L, DV)), dyadic((DV, DK))
beta = rng.integers(0, 9, size=L) / 8
alpha = rng.integers(1, 9, size=L) / 8


def equal(a, b):
    return a.shape == b.shape and all(x == y for x, y in zip(a.reshape(-1), b.reshape(-1)))


def test_exact_results_are_fractions():
    r = linear_attention.recurrent(q, k, v, h0, scalar="exact")
    assert r.o.dtype == object and isinstance(r.o[0, 0], Fraction)
    assert r.o.shape == (L, DV) and r.ht.shape == (DV, DK)


def test_linear_attention_forms_equal_exactly():
    ref = linear_attention.recurrent(q, k, v, h0, scalar="exact")
    for r in [linear_attention.parallel(q, k, v, h0, scalar="exact")] + \
             [linear_attention.chunkwise(q, k, v, C, h0, scalar="exact") for C in (1, 2, 3, 7, 8)]:
        assert equal(r.o, ref.o) and equal(r.ht, ref.ht)
    g = linear_attention.recurrent_backward(q, k, v, do, h0, dht, scalar="exact")
    for r in [linear_attention.parallel_backward(q, k, v, do, h0, dht, scalar="exact"),
              linear_attention.chunkwise_backward(q, k, v, do, 3, h0, dht, scalar="exact")]:
        for name in ("dq", "dk", "dv", "dh0"):
            assert equal(r[name], g[name]), name


def test_delta_rule_forms_equal_exactly():
    ref = delta_rule.recurrent(q, k, v, beta, h0, scalar="exact")
    forms = [delta_rule.recurrent_read_correct_write(q, k, v, beta, h0, scalar="exact"),
             delta_rule.affine_scan(q, k, v, beta, h0, scalar="exact"),
             delta_rule.parallel(q, k, v, beta, h0, scalar="exact")]
    forms += [delta_rule.chunkwise(q, k, v, beta, C, h0, solve, base_block=2, scalar="exact")
              for C in (1, 3, 4) for solve in delta_rule.SOLVES]
    for r in forms:
        assert equal(r.o, ref.o) and equal(r.ht, ref.ht)
    g = delta_rule.recurrent_backward(q, k, v, beta, do, h0, dht, scalar="exact")
    for C in (2, 3, 7):
        r = delta_rule.chunkwise_backward(q, k, v, beta, do, C, h0, dht, scalar="exact")
        for name in ("dq", "dk", "dv", "dbeta", "dh0"):
            assert equal(r[name], g[name]), (C, name)


def test_delta_rule_wy_factors_equal_exactly():
    kc, vc, bc = k[:4], v[:4], beta[:4]
    rec = delta_rule.wy_recurrence(kc, vc, bc, scalar="exact")
    for solve in delta_rule.SOLVES:
        f = delta_rule.wy_factors(kc, vc, bc, solve, base_block=1, scalar="exact")
        assert equal(f.W, rec.W) and equal(f.U, rec.U) and equal(f.A, rec.A)
        product = f.A.dot(f.T)
        assert equal(product, np.eye(4, dtype=int).astype(object))
    c = delta_rule.chunkwise(q, k, v, beta, 4, h0, scalar="exact")
    assert equal(c.chunks[0]["W"], rec.W) and equal(c.chunks[0]["U"], rec.U)


def test_gated_delta_rule_forms_equal_exactly():
    ref = gated_delta_rule.recurrent(q, k, v, beta, alpha, h0, scalar="exact")
    forms = [gated_delta_rule.recurrent_read_correct_write(q, k, v, beta, alpha, h0, scalar="exact"),
             gated_delta_rule.affine_scan(q, k, v, beta, alpha, h0, scalar="exact"),
             gated_delta_rule.parallel(q, k, v, beta, alpha, h0, scalar="exact")]
    forms += [gated_delta_rule.chunkwise(q, k, v, beta, alpha, C, h0, solve, base_block=2, scalar="exact")
              for C in (1, 3, 4) for solve in delta_rule.SOLVES]
    for r in forms:
        assert equal(r.o, ref.o) and equal(r.ht, ref.ht)
    g = gated_delta_rule.recurrent_backward(q, k, v, beta, alpha, do, h0, dht, scalar="exact")
    r = gated_delta_rule.chunkwise_backward(q, k, v, beta, alpha, do, 3, h0, dht, scalar="exact")
    for name in ("dq", "dk", "dv", "dbeta", "dalpha", "dh0"):
        assert equal(r[name], g[name]), name
    wy = gated_delta_rule.wy_recurrence(k[:3], v[:3], beta[:3], alpha[:3], scalar="exact")
    c = gated_delta_rule.chunkwise(q, k, v, beta, alpha, 3, h0, scalar="exact")
    assert equal(c.chunks[0]["W"], wy.W) and equal(c.chunks[0]["decay"], wy.decay)
    # additive scalar gate: recurrence and chunkwise
    a = gated_delta_rule.additive_recurrent(q, k, v, alpha, h0, scalar="exact")
    b = gated_delta_rule.additive_chunkwise(q, k, v, alpha, 3, h0, scalar="exact")
    assert equal(a.o, b.o) and equal(a.ht, b.ht)


def test_fraction_inputs_are_taken_exactly():
    third = np.full((2, 1), Fraction(1, 3), dtype=object)
    r = linear_attention.recurrent(third, third, third, scalar="exact")
    assert r.o[1, 0] == Fraction(2, 27)  # o_2 = (v_1 k_1 + v_2 k_2) q_2 = 2/27


def test_double_and_high_agree_with_exact():
    exact = gated_delta_rule.recurrent(q, k, v, beta, alpha, h0, scalar="exact")
    for scalar in ("double", "high"):
        r = gated_delta_rule.chunkwise(q, k, v, beta, alpha, 3, h0, scalar=scalar)
        assert r.o.dtype == np.float64
        np.testing.assert_allclose(r.o, exact.o.astype(float), rtol=0, atol=1e-12)
    log = gated_delta_rule.chunkwise_log_gate(q, k, v, beta, np.log(alpha), 3, h0, scalar="high")
    np.testing.assert_allclose(log.o, exact.o.astype(float), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="exact"):
        gated_delta_rule.chunkwise_log_gate(q, k, v, beta, np.log(alpha), 3, h0, scalar="exact")


def test_log_gate_gradient_is_alpha_times_alpha_gradient():
    ga = gated_delta_rule.chunkwise_backward(q, k, v, beta, alpha, do, 3, h0, dht, scalar="high")
    gg = gated_delta_rule.chunkwise_log_gate_backward(q, k, v, beta, np.log(alpha), do, 3, h0, dht, scalar="high")
    np.testing.assert_allclose(gg.dg, alpha * ga.dalpha, rtol=1e-12, atol=1e-14)


def test_bf16_rounding_is_round_to_nearest_even():
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -(1 + 2 ** -8), 3.0e38, 1.0e-40, np.nan],
                 dtype=np.float32)
    r = deltaproof.round_to_bf16(x)
    assert r[0] == 1.0 and r[1] == 1 + 4 * 2 ** -8 and r[2] == 1 + 2 ** -7 and r[3] == -1.0
    assert r[4] == np.float32(3.0040553e38) and np.isnan(r[6])
    y = rng.standard_normal(10000).astype(np.float32)
    b = deltaproof.round_to_bf16(y)
    assert np.all(b.view(np.uint32) & 0xFFFF == 0)
    assert np.all(np.abs(b - y) <= np.abs(y) * 2.0 ** -8)
    np.testing.assert_array_equal(deltaproof.round_to_bf16(y.astype(np.float64)), b)  # no double rounding here
