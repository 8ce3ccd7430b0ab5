"""Test-Time Training, one sequence: a fast weight W (DV, DF) on a frozen feature map φ, trained by
one gradient step per token (or per mini-batch) on ℓ(W φ(k_t), v_t), read as o_t = W_t φ(q_t).

Every function binds reference/ttt.hpp. Shapes: q, k (L, DK); v (L, DV); eta, momentum (L,);
h0 = W_0 (DV, DF), absent means 0. ``loss``: "squared" ½‖f − v‖² (DeltaNet), "linear" −vᵀf (linear
attention) or "quartic" ¼Σ(f − v)⁴. ``features``: "identity" φ(x) = x (DF = DK) or "quadratic"
φ(x) = [x, x ⊙ x] (DF = 2 DK). ``scalar`` as in linear_attention.
"""
from fractions import Fraction

from ._backend import core
from ._convert import from_core, to_core

LOSSES = ("squared", "linear", "quartic")
FEATURES = ("identity", "quadratic")


def _forward(form, q, k, v, eta, h0, loss, features, batch_size, momentum, scalar, high_exact=False):
    return from_core(core().ttt_forward(scalar, form, loss, features, to_core(q, scalar, "q"), to_core(k, scalar, "k"),
                                        to_core(v, scalar, "v"), to_core(eta, scalar, "eta"),
                                        to_core(h0, scalar, "h0"), int(batch_size),
                                        to_core(momentum, scalar, "momentum"), bool(high_exact)))


def gradient_descent(q, k, v, eta, h0=None, loss="squared", features="identity", batch_size=1, momentum=None,
                     scalar="double"):
    """The plain loop, gradients by dual numbers: per mini-batch with start weights W_s, for t in order
    G_t = ∇_W ℓ(W φ(k_t), v_t)|_{W_s}, W ← W − η_t G_t (with momentum: M ← a_t M + η_t G_t, W ← W − M),
    o_t = W φ(q_t). batch_size = 1 is tokenwise TTT.  Result(o, ht)."""
    return _forward("gradient_descent", q, k, v, eta, h0, loss, features, batch_size, momentum, scalar)


def as_linear_attention(q, k, v, eta, h0=None, loss="squared", features="identity", scalar="double"):
    """The same run as linear-attention writes: S_t = S_{t−1} + v̂_t k̂_tᵀ with k̂_t = φ(k_t),
    v̂_t = −η_t ∂ℓ/∂f(S_{t−1} k̂_t, v_t), o_t = S_t φ(q_t).
    Result(o, ht, writes) with writes = Result(q, k, v, h0): q̂, k̂, v̂ and S_0 for linear_attention."""
    return _forward("as_linear_attention", q, k, v, eta, h0, loss, features, 1, None, scalar)


def momentum_linear_attention(q, k, v, eta, momentum, h0=None, loss="squared", features="identity", scalar="double"):
    """Tokenwise TTT with momentum as masked linear attention:
    o_t = W_0 φ(q_t) + Σ_{i≤t} A_ti (φ(k_i)·φ(q_t)) g_i, A = momentum_mask(a).  Result(o, ht)."""
    return _forward("momentum_linear_attention", q, k, v, eta, h0, loss, features, 1, momentum, scalar)


def momentum_mask(momentum, scalar="double"):
    """A_ti = Σ_{j=i..t} Π_{s=i+1..j} a_s for i ≤ t, 0 above the diagonal; (L, L)."""
    return from_core(core().ttt_momentum_mask(scalar, to_core(momentum, scalar, "momentum")))


def minibatch_dual(q, k, v, eta, batch_size, h0=None, loss="squared", features="identity", scalar="double"):
    """TTT-Linear's dual form per batch with start weights W_s: G = ∂ℓ/∂f(Φ(K) W_sᵀ, V), H = diag(η) G,
    O = Φ(Q) W_sᵀ − (Φ(Q) Φ(K)ᵀ ⊙ M) H, W ← W_s − Hᵀ Φ(K).  Result(o, ht)."""
    return _forward("minibatch_dual", q, k, v, eta, h0, loss, features, batch_size, None, scalar)


def _mlp(form, q, k, v, eta, w1, w2, batch_size, scalar, fractions):
    return from_core(core().ttt_mlp(scalar, form, to_core(q, scalar, "q"), to_core(k, scalar, "k"),
                                    to_core(v, scalar, "v"), to_core(eta, scalar, "eta"), to_core(w1, scalar, "w1"),
                                    to_core(w2, scalar, "w2"), int(batch_size), bool(fractions)))


def mlp_minibatch_primal(q, k, v, eta, w1, w2, batch_size, scalar="high", fractions=False):
    """TTT-MLP f(x) = W2 gelu(W1 x), squared loss, the explicit loop (gradients by dual numbers).
    w1 (DH, DK), w2 (DV, DH); "high" or "double". fractions=True returns High's values exactly, as
    Fraction arrays.  Result(o, w1, w2)."""
    return _mlp("primal", q, k, v, eta, w1, w2, batch_size, scalar, fractions)


def mlp_minibatch_dual(q, k, v, eta, w1, w2, batch_size, scalar="high", fractions=False):
    """TTT-MLP's dual form: Z1q = Q W1ᵀ − (Q Kᵀ ⊙ M) E G1, O = σ(Z1q) W2ᵀ − (σ(Z1q) X2ᵀ ⊙ M) E G2.
    Same arguments and Result(o, w1, w2) as mlp_minibatch_primal."""
    return _mlp("dual", q, k, v, eta, w1, w2, batch_size, scalar, fractions)


def high_agreement_bound(reference):
    """10⁻⁶⁰ (1 + max|reference|) as a Fraction: how far two High evaluations of one value may differ
    (reference/high_agreement.hpp). reference: a 2-D array (Fractions or floats)."""
    return Fraction(core().high_agreement_bound(to_core(reference, "exact", "reference")))
