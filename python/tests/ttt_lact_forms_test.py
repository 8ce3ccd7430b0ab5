"""The TTT and LaCT bindings against the forms already bound, over ℚ with ==: tokenwise TTT is
DeltaNet and linear attention, its writes replay through linear attention, mini-batch primal = dual,
LaCT's linear fast weight is masked linear attention (causal linear attention at C = 1), and the
measured dependency masks are the predicted ones. TTT-MLP and SwiGLU in High within the agreement
bound; arguments named in errors."""
from fractions import Fraction

import numpy as np
import pytest

from deltaproof import delta_rule, lact, linear_attention, ttt

rng = np.random.default_rng(12)


def dyadic(shape, denominator=4):
    return rng.integers(-4, 5, size=shape) / denominator


def positive(shape):
    return rng.integers(1, 9, size=shape) / 4


def equal(a, b):
    return a.shape == b.shape and all(x == y for x, y in zip(a.reshape(-1), b.reshape(-1)))


def max_abs_difference(a, b):
    return max(abs(Fraction(x) - Fraction(y)) for x, y in zip(a.reshape(-1), b.reshape(-1)))


L, DK, DV = 6, 3, 2
q, k, v = dyadic((L, DK)), dyadic((L, DK)), dyadic((L, DV))
h0 = dyadic((DV, DK))
eta = rng.integers(1, 9, size=L) / 8
a = rng.integers(1, 5, size=L) / 4


def test_tokenwise_squared_loss_is_delta_rule():
    gd = ttt.gradient_descent(q, k, v, eta, h0, loss="squared", scalar="exact")
    dn = delta_rule.recurrent(q, k, v, eta, h0, scalar="exact")
    assert isinstance(gd.o[0, 0], Fraction)
    assert equal(gd.o, dn.o) and equal(gd.ht, dn.ht)


def test_tokenwise_linear_objective_is_linear_attention_with_values_eta_v():
    gd = ttt.gradient_descent(q, k, v, eta, h0, loss="linear", scalar="exact")
    la = linear_attention.recurrent(q, k, eta[:, None] * v, h0, scalar="exact")
    assert equal(gd.o, la.o) and equal(gd.ht, la.ht)


@pytest.mark.parametrize("loss,features,n", [("squared", "identity", L), ("squared", "quadratic", L),
                                             ("linear", "quadratic", L), ("quartic", "quadratic", 3)])
def test_writes_replay_through_linear_attention(loss, features, n):
    w0 = dyadic((DV, DK if features == "identity" else 2 * DK))
    gd = ttt.gradient_descent(q[:n], k[:n], v[:n], eta[:n], w0, loss=loss, features=features, scalar="exact")
    r = ttt.as_linear_attention(q[:n], k[:n], v[:n], eta[:n], w0, loss=loss, features=features, scalar="exact")
    replay = linear_attention.recurrent(r.writes.q, r.writes.k, r.writes.v, r.writes.h0, scalar="exact")
    assert equal(gd.o, replay.o) and equal(gd.ht, replay.ht)
    assert equal(r.o, gd.o)


def test_momentum_is_linear_attention_with_the_momentum_mask():
    gd = ttt.gradient_descent(q, k, v, eta, h0, momentum=a, scalar="exact")
    masked = ttt.momentum_linear_attention(q, k, v, eta, a, h0, scalar="exact")
    assert equal(gd.o, masked.o) and equal(gd.ht, masked.ht)
    mask = ttt.momentum_mask(np.zeros(L), scalar="exact")  # a ≡ 0: the causal mask
    assert equal(mask, np.tril(np.ones((L, L), dtype=int)).astype(object))


@pytest.mark.parametrize("b", [1, 2, 4, L])
def test_minibatch_primal_equals_dual(b):
    primal = ttt.gradient_descent(q, k, v, eta, h0, batch_size=b, scalar="exact")
    dual = ttt.minibatch_dual(q, k, v, eta, b, h0, scalar="exact")
    assert equal(primal.o, dual.o) and equal(primal.ht, dual.ht)
    if b == 1:
        assert equal(dual.o, delta_rule.recurrent(q, k, v, eta, h0, scalar="exact").o)


def test_minibatch_differs_from_tokenwise_when_b_exceeds_one():
    # a check that cannot fail is no check: b = 2 really changes the outputs
    assert not equal(ttt.minibatch_dual(q, k, v, eta, 2, h0, scalar="exact").o,
                     ttt.gradient_descent(q, k, v, eta, h0, scalar="exact").o)


def test_double_and_high_agree_with_exact():
    exact = ttt.minibatch_dual(q, k, v, eta, 2, h0, scalar="exact")
    for scalar in ("double", "high"):
        r = ttt.minibatch_dual(q, k, v, eta, 2, h0, scalar=scalar)
        assert r.o.dtype == np.float64
        assert np.array_equal(r.o, exact.o.astype(np.float64))  # dyadic, short: no rounding at all


def test_mlp_primal_equals_dual_in_high():
    w1, w2 = dyadic((4, DK)), dyadic((DV, 4))
    small = eta / 16
    primal = ttt.mlp_minibatch_primal(q, k, v, small, w1, w2, 2, fractions=True)
    dual = ttt.mlp_minibatch_dual(q, k, v, small, w1, w2, 2, fractions=True)
    for name in ("o", "w1", "w2"):
        assert max_abs_difference(primal[name], dual[name]) <= ttt.high_agreement_bound(dual[name]), name
    # the two layers' updates matter: tokenwise (b = 1) differs from b = 2 far above the bound
    one = ttt.mlp_minibatch_dual(q, k, v, small, w1, w2, 1, fractions=True)
    assert max_abs_difference(one.o, dual.o) > 10 ** 20 * ttt.high_agreement_bound(dual.o)
    with pytest.raises(ValueError, match="scalar"):
        ttt.mlp_minibatch_primal(q, k, v, small, w1, w2, 2, scalar="exact")


def test_ttt_errors_name_the_argument():
    with pytest.raises(ValueError, match="loss"):
        ttt.gradient_descent(q, k, v, eta, loss="cubic")
    with pytest.raises(ValueError, match="eta"):
        ttt.gradient_descent(q, k, v, eta[:3])
    with pytest.raises(ValueError, match="batch_size"):
        ttt.minibatch_dual(q, k, v, eta, 0)


# ---------------------------------------------------------------------------------------------
# LaCT

W0 = dyadic((DV, DK))


@pytest.mark.parametrize("schedule", lact.SCHEDULES)
@pytest.mark.parametrize("mu", [0, Fraction(1, 2)])
def test_lact_linear_fast_weight_is_masked_linear_attention(schedule, mu):
    C = 4
    fwd = lact.forward(q, k, v, eta, [W0], schedule, C, momentum=mu, scalar="exact")
    mask = lact.block_mask(schedule, L, C, momentum=mu, scalar="exact")
    expected = lact.masked_linear_attention(q, k, eta[:, None] * v, W0, mask, scalar="exact")
    assert equal(fwd.o, expected)
    assert len(fwd.boundary_weights) == (1 if schedule == "single" else 2)


def test_lact_update_apply_at_chunk_one_is_causal_linear_attention():
    fwd = lact.forward(q, k, v, eta, [W0], "update-apply", 1, scalar="exact")
    la = linear_attention.parallel(q, k, eta[:, None] * v, W0, scalar="exact")
    assert equal(fwd.o, la.o) and equal(fwd.final_weights[0], la.ht)


def test_lact_chunk_gradient_closed_form_equals_dual_numbers():
    g = lact.chunk_gradient([W0], k[:4], v[:4], eta[:4], scalar="exact")
    d = lact.chunk_gradient([W0], k[:4], v[:4], eta[:4], method="dual", scalar="exact")
    assert equal(g[0], d[0])
    w = [dyadic((4, DK)), dyadic((DV, 4)), dyadic((4, DK))]
    gs = lact.chunk_gradient(w, k[:4], v[:4], eta[:4], fast_weight="swiglu", scalar="high", fractions=True)
    ds = lact.chunk_gradient(w, k[:4], v[:4], eta[:4], method="dual", fast_weight="swiglu", scalar="high",
                             fractions=True)
    for x, y in zip(gs, ds):
        assert max_abs_difference(x, y) <= ttt.high_agreement_bound(y)


def test_lact_masks_measured_equal_predicted_and_name_the_gap():
    n, C, W = 8, 4, 2
    pq, pk, pv = positive((n, DK)), positive((n, DK)), positive((n, DV))
    peta = rng.integers(1, 9, size=n) / 8
    for schedule in lact.SCHEDULES:
        predicted = lact.predicted_dependencies(schedule, n, C)
        measured = lact.measure_dependencies(pq, pk, pv, peta, [positive((DV, DK))], schedule, C)
        assert predicted.dtype == bool and predicted.shape == (n, n)
        assert lact.mask_differences(predicted, measured) == []
    predicted = lact.predicted_dependencies("apply-update", n, C, W)
    measured = lact.measure_dependencies(pq, pk, pv, peta / 8, [positive((4, DK)), positive((DV, 4)),
                                                                positive((4, DK))], "apply-update", C, W,
                                         fast_weight="swiglu", method="perturbation")
    assert lact.mask_differences(predicted, measured) == []
    assert lact.causal_gaps(measured) == [(2, 0), (3, 0), (3, 1), (6, 4), (7, 4), (7, 5)]
    grid = lact.mask_grid(measured)
    assert grid.splitlines()[3] == "..##...."  # output 3 in the first chunk: its read and the window only
    wrong = measured.copy()
    wrong[7, 5] = True
    assert lact.mask_differences(predicted, wrong) == [(7, 5)]
    assert lact.mask_difference_grid(predicted, wrong).splitlines()[7][5] == "+"


def test_lact_errors_name_the_argument():
    with pytest.raises(ValueError, match="schedule"):
        lact.forward(q, k, v, eta, [W0], "sideways", 2)
    with pytest.raises(ValueError, match="fast_weight"):
        lact.forward(q, k, v, eta, [W0], fast_weight="swiglu", scalar="exact")
    with pytest.raises(ValueError, match="chunk_size"):
        lact.forward(q, k, v, eta, [W0], chunk_size=0)
    with pytest.raises(ValueError, match="window"):
        lact.forward(q, k, v, eta, [W0], window=2, scalar="exact")
