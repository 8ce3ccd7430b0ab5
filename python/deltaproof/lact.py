"""Large-Chunk Test-Time Training (LaCT), one sequence: a fast weight updated once per chunk from the
summed gradients of ℓ_c(W) = −Σ_{i∈c} η_i ⟨f_W(k_i), v_i⟩ at the chunk's starting weights W_[c]:
g_c = ∇ℓ_c(W_[c]), Δ_c = μ Δ_{c−1} + g_c, U_c = NS(Δ_c) or Δ_c, W_[c+1] = norm(W_[c] − U_c).

Every function binds reference/lact.hpp. Shapes: q, k (L, DK); v (L, DV); eta (L,); ``weights`` the
list W_[0]: [W (DV, DK)] for ``fast_weight="linear"``, [W0 (DH, DK), W1 (DV, DH), W2 (DH, DK)] for
"swiglu" (f(x) = W1 (silu(W0 x) ⊙ (W2 x))). ``schedule``: "update-apply" (chunk c reads W_[c+1]),
"apply-update" (reads W_[c]; the last chunk updates nothing) or "single" (C = L, update-apply).
SwiGLU, the window, weight_norm and orthogonalize (Newton–Schulz) need "double" or "high".
Dependency masks are bool arrays D (L, L): D[i, j] when token j (q_j, k_j, v_j, η_j) may influence o_i.
"""
import numpy as np

from ._backend import core
from ._convert import from_core, to_core

SCHEDULES = ("update-apply", "apply-update", "single")
FAST_WEIGHTS = ("linear", "swiglu")


def _weights(weights, scalar):
    return [to_core(w, scalar, "weights") for w in weights]


def _momentum(momentum, scalar):
    return to_core(np.array([momentum], dtype=object), scalar, "momentum")


def forward(q, k, v, eta, weights, schedule="update-apply", chunk_size=1, window=0, momentum=0,
            weight_norm=False, orthogonalize=False, fast_weight="linear", scalar="double", fractions=False):
    """LaCT's forward pass. window: a causal sliding-window softmax attention over the W most recent
    tokens, added to the output (0 = none). fractions=True returns High's values exactly as Fractions.
    Result(o, fast_weight_output, window_output, final_weights, boundary_weights[c] = W_[c])."""
    return from_core(core().lact_forward(scalar, fast_weight, to_core(q, scalar, "q"), to_core(k, scalar, "k"),
                                         to_core(v, scalar, "v"), to_core(eta, scalar, "eta"),
                                         _weights(weights, scalar), schedule, int(chunk_size), int(window),
                                         _momentum(momentum, scalar), bool(weight_norm), bool(orthogonalize),
                                         bool(fractions)))


def chunk_gradient(weights, k, v, eta, method="closed_form", fast_weight="linear", scalar="double", fractions=False):
    """∇ℓ_c at `weights` for one chunk's k, v, eta: "closed_form" (what forward uses) or "dual"
    (forward-mode differentiation of ℓ_c, one weight at a time). A list like `weights`."""
    return from_core(core().lact_chunk_gradient(scalar, fast_weight, method, _weights(weights, scalar),
                                                to_core(k, scalar, "k"), to_core(v, scalar, "v"),
                                                to_core(eta, scalar, "eta"), bool(fractions)))


def block_mask(schedule, length, chunk_size, momentum=0, scalar="double"):
    """M_ij = Σ_{c = chunk(j)..r(i)} μ^{c − chunk(j)}, r(i) the last chunk output i's weights absorbed:
    the mask that makes the linear fast weight masked linear attention; (L, L)."""
    return from_core(core().lact_block_mask(scalar, schedule, int(length), int(chunk_size),
                                            _momentum(momentum, scalar)))


def masked_linear_attention(q, k, v, h0, mask, scalar="double"):
    """O = Q S_0ᵀ + (Q Kᵀ ⊙ M) V for any mask M (L, L); h0 = S_0 (DV, DK)."""
    return from_core(core().lact_masked_linear_attention(scalar, to_core(q, scalar, "q"), to_core(k, scalar, "k"),
                                                         to_core(v, scalar, "v"), to_core(h0, scalar, "h0"),
                                                         to_core(mask, scalar, "mask")))


def predicted_dependencies(schedule, length, chunk_size, window=0):
    """D[i, j] = (j == i) or chunk(j) <= r(i) or (i − W < j <= i): from the schedule alone."""
    return core().lact_predicted_dependencies(schedule, int(length), int(chunk_size), int(window))


def measure_dependencies(q, k, v, eta, weights, schedule="update-apply", chunk_size=1, window=0, momentum=0,
                         weight_norm=False, orthogonalize=False, fast_weight="linear", method="exact"):
    """D measured by running forward: "exact" — some ∂o_i/∂x is nonzero for a scalar x of token j, every
    derivative exact over ℚ (linear fast weight, no window); "perturbation" — output row i is not
    bitwise unchanged in High when every scalar of token j moves (any fast weight, window, options).
    A zero is structure only at a generic point: use inputs without accidental zeros."""
    scalar = "exact" if method == "exact" else "high"
    return core().lact_measure_dependencies(method, fast_weight, to_core(q, scalar, "q"), to_core(k, scalar, "k"),
                                            to_core(v, scalar, "v"), to_core(eta, scalar, "eta"),
                                            _weights(weights, scalar), schedule, int(chunk_size), int(window),
                                            _momentum(momentum, scalar), bool(weight_norm), bool(orthogonalize))


def mask_grid(mask):
    """Rows outputs i, columns inputs j: '#' dependence, '.' none (as `deltaproof masks` prints)."""
    return core().lact_mask_grid(np.asarray(mask, dtype=bool))


def mask_difference_grid(predicted, measured):
    """'#' in both, '.' in neither, '-' predicted only, '+' measured only."""
    return core().lact_mask_difference_grid(np.asarray(predicted, dtype=bool), np.asarray(measured, dtype=bool))


def mask_differences(a, b):
    """The (i, j) pairs where two masks differ."""
    return [tuple(p) for p in core().lact_mask_differences(np.asarray(a, dtype=bool), np.asarray(b, dtype=bool))]


def causal_gaps(mask):
    """Causal pairs (i, j), j <= i, that output i cannot see: the gap a schedule leaves."""
    return [tuple(p) for p in core().lact_causal_gaps(np.asarray(mask, dtype=bool))]
