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


U64 = 2.0 ** -53


def relative_l2(candidate, exact):
    e = exact.astype(float)
    return np.linalg.norm(candidate - e) / np.linalg.norm(e)


def test_double_and_high_agree_with_exact():
    exact = gated_delta_rule.recurrent(q, k, v, beta, alpha, h0, scalar="exact")
    # High, returned as float64: each entry is the 100-digit value (within reference/high_agreement.hpp's
    # 10⁻⁶⁰(1 + max|o|)) rounded once to double (u|o|), so the bound is elementwise and derived.
    high = gated_delta_rule.chunkwise(q, k, v, beta, alpha, 3, h0, scalar="high")
    assert high.o.dtype == np.float64
    agreement = deltaproof.ttt.high_agreement_bound(exact.o)
    for got, want in zip(high.o.reshape(-1), exact.o.reshape(-1)):
        assert abs(Fraction(got) - want) <= U64 * abs(want) + agreement
    # Double: no a-priori elementwise bound for the delta family (T = A⁻¹ is unbounded), so it is
    # calibrated as `deltaproof verify` does: relative L2 ≤ max(4 × the double recurrence's, 16 u).
    double = gated_delta_rule.chunkwise(q, k, v, beta, alpha, 3, h0, scalar="double")
    baseline = relative_l2(gated_delta_rule.recurrent(q, k, v, beta, alpha, h0, scalar="double").o, exact.o)
    assert relative_l2(double.o, exact.o) <= max(4 * baseline, 16 * U64)
    # The log-gate path takes g = fl(ln α) (relative error ≤ u per gate), so it is judged by the same
    # floating-point criterion; its own arithmetic is High.
    log = gated_delta_rule.chunkwise_log_gate(q, k, v, beta, np.log(alpha), 3, h0, scalar="high")
    assert relative_l2(log.o, exact.o) <= max(4 * baseline, 16 * U64)
    with pytest.raises(ValueError, match="exact"):
        gated_delta_rule.chunkwise_log_gate(q, k, v, beta, np.log(alpha), 3, h0, scalar="exact")


def test_log_gate_gradient_is_alpha_times_alpha_gradient():
    ga = gated_delta_rule.chunkwise_backward(q, k, v, beta, alpha, do, 3, h0, dht, scalar="high")
    gg = gated_delta_rule.chunkwise_log_gate_backward(q, k, v, beta, np.log(alpha), do, 3, h0, dht, scalar="high")
    # Both in High; they differ only through g = fl(ln α): the floating-point criterion above.
    assert relative_l2(gg.dg, alpha * ga.dalpha) <= 16 * U64


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


def fraction_inner(a, b):
    """Σ a_i b_i over ℚ (float entries taken exactly)."""
    return sum((Fraction(x) * Fraction(y) for x, y in zip(np.asarray(a).reshape(-1), np.asarray(b).reshape(-1))),
               Fraction(0))


def test_linear_attention_directional_derivatives_agree_exactly():
    direction = [dyadic(q.shape), dyadic(k.shape), dyadic(v.shape), dyadic(h0.shape)]
    backward = {"parallel": linear_attention.parallel_backward(q, k, v, do, h0, dht, scalar="exact"),
                "recurrent": linear_attention.recurrent_backward(q, k, v, do, h0, dht, scalar="exact"),
                "chunkwise": linear_attention.chunkwise_backward(q, k, v, do, 3, h0, dht, scalar="exact")}
    for form, g in backward.items():
        paired = sum((fraction_inner(g[name], u) for name, u in zip(("dq", "dk", "dv", "dh0"), direction)), Fraction(0))
        for method in ("dual", "backward"):
            d = linear_attention.directional_derivative(q, k, v, do, direction, form, 3, h0, dht, method=method)
            assert isinstance(d, Fraction) and d == paired, (form, method)


def test_linear_attention_central_difference_is_the_cubic_term_plus_high_rounding():
    # L(x + t·u) is a cubic in t whose t³ coefficient is <dO, (U_q U_kᵀ ⊙ M) U_v>, so in exact
    # arithmetic the central difference is L'(0) + c3·h²; High adds ≈ 1e-100·|L|/h on top.
    direction = [dyadic(q.shape), dyadic(k.shape), dyadic(v.shape), dyadic(h0.shape)]
    exact = linear_attention.directional_derivative(q, k, v, do, direction, "recurrent", 1, h0, dht)
    c3 = fraction_inner(do, linear_attention.parallel(*direction[:3], scalar="exact").o)
    assert c3 != 0
    for step in (Fraction(1, 2 ** 10), Fraction(1, 10 ** 20), 1e-30):
        fd = linear_attention.directional_derivative(q, k, v, do, direction, "chunkwise", 3, h0, dht,
                                                     method="central_difference", step=step)
        d = fd.denominator
        assert d & (d - 1) == 0  # a High value converted exactly: a dyadic rational
        h = Fraction(step)
        assert abs(fd - exact - c3 * h * h) < Fraction(1, 10 ** 80) / h
    with pytest.raises(ValueError, match="step"):
        linear_attention.directional_derivative(q, k, v, do, direction, method="central_difference")
    with pytest.raises(ValueError, match="direction"):
        linear_attention.directional_derivative(q, k, v, do, direction[:2])


def test_delta_rule_blocked_levels_and_prefix_products_equal_exactly():
    n = 7
    kc, vc, bc = dyadic((n, DK)), dyadic((n, DV)), rng.integers(0, 9, size=n) / 8
    a = delta_rule.wy_factors(kc, vc, bc, scalar="exact").A
    blocked = delta_rule.invert_unit_lower_blocked(a, base_block=2, scalar="exact")
    assert equal(blocked.T, delta_rule.invert_unit_lower(a, "forward_substitution", scalar="exact"))
    assert equal(blocked.T, delta_rule.invert_unit_lower(a, "blocked", base_block=2, scalar="exact"))
    padded = np.eye(8, dtype=int).astype(object)
    padded[:n, :n] = a
    levels = [blocked.diagonal_block_inverses] + blocked.merged_levels
    assert [len(level) for level in levels] == [4, 2, 1]
    for level in levels:
        size = level[0].shape[0]
        for j, t in enumerate(level):
            block = padded[j * size:(j + 1) * size, j * size:(j + 1) * size]
            assert equal(block.dot(t), np.eye(size, dtype=int).astype(object))
    sequential = delta_rule.prefix_products(kc, vc, bc, "sequential", scalar="exact")
    assert len(sequential) == n
    for method in ("tree", "wy"):
        other = delta_rule.prefix_products(kc, vc, bc, method, scalar="exact")
        for s, o in zip(sequential, other):
            assert equal(s.P, o.P) and equal(s.H, o.H), method
    # S_0 P_C + H_C is the recurrence's final state over the chunk.
    r = delta_rule.recurrent(dyadic((n, DK)), kc, vc, bc, h0, scalar="exact")
    assert equal(h0.astype(object).dot(sequential[-1].P) + sequential[-1].H, r.ht)


def test_delta_rule_conditioning_reads_the_exact_wy_factors():
    rows = delta_rule.conditioning(q, k * 4, v, beta, (1, 3, 7), h0)
    assert [r["chunk_size"] for r in rows] == [1, 3, 7]
    for row in rows:
        chunks = delta_rule.chunkwise(q, k * 4, v, beta, row["chunk_size"], h0, scalar="exact").chunks
        assert row["max_abs_t"] == max(float(abs(x)) for c in chunks for x in c["T"].reshape(-1))
        assert row["max_abs_w"] == max(float(abs(x)) for c in chunks for x in c["W"].reshape(-1))
        assert row["chunkwise_finite"] and row["recurrence_finite"]
    with pytest.raises(ValueError, match="float_type"):
        delta_rule.conditioning(q, k, v, beta, (1,), float_type="half")


def test_gated_decays_equal_the_chunkwise_decays():
    exact = gated_delta_rule.decay_from_gates(alpha[:4], scalar="exact")
    assert equal(exact, gated_delta_rule.wy_recurrence(k[:4], v[:4], beta[:4], alpha[:4], scalar="exact").decay)
    assert exact[4, 1] == Fraction(alpha[1]) * Fraction(alpha[2]) * Fraction(alpha[3]) and exact[1, 2] == 0
    g = np.log(alpha)
    log_double = gated_delta_rule.decay_from_log_gates(g[:4], scalar="double")
    chunk = gated_delta_rule.chunkwise_log_gate(q, k, v, beta, g, 4, h0, scalar="double").chunks[0]["decay"]
    np.testing.assert_array_equal(log_double, chunk)  # the same function, the same arithmetic
    log_float = gated_delta_rule.decay_from_log_gates(g[:4], scalar="float")
    assert np.all(log_float.astype(np.float32).astype(np.float64) == log_float)  # evaluated in float32
    assert np.all(np.triu(log_float, 1) == 0) and np.all(np.diag(log_float) == 1)
    with pytest.raises(ValueError, match="exact"):
        gated_delta_rule.decay_from_log_gates(g[:4], scalar="exact")


def test_linear_attention_time_forward_times_each_run():
    seconds = linear_attention.time_forward(q, k, v, "chunkwise", 3, h0, repeats=3)
    assert len(seconds) == 3 and all(isinstance(s, float) and s > 0 for s in seconds)
    with pytest.raises(ValueError, match="repeats"):
        linear_attention.time_forward(q, k, v, "parallel", repeats=0)
    with pytest.raises(ValueError, match="form"):
        linear_attention.time_forward(q, k, v, "sideways")
