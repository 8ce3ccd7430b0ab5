"""DeltaNet, one head: S_t = S_{t-1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t.

Every function binds reference/delta_rule.hpp. Shapes: q, k (L, DK); v, do (L, DV); beta (L,);
states (DV, DK). ``solve`` picks the triangular solve of A T = I inside each chunk:
"forward_substitution", "blocked" (the derivation's GPU schedule: base blocks merged 16 → 32 → 64) or
"recursive" (split at n/2); ``base_block`` is their base size. ``scalar`` as in linear_attention.
"""
from ._backend import core
from ._convert import from_core, to_core

SOLVES = ("forward_substitution", "blocked", "recursive")


def _inputs(q, k, v, beta, h0, scalar):
    return (to_core(q, scalar, "q"), to_core(k, scalar, "k"), to_core(v, scalar, "v"),
            to_core(beta, scalar, "beta"), to_core(h0, scalar, "h0"))


def _forward(form, q, k, v, beta, h0, chunk_size=1, solve="forward_substitution", base_block=16, scalar="double"):
    return from_core(core().delta_forward(scalar, form, *_inputs(q, k, v, beta, h0, scalar), int(chunk_size), solve,
                                         int(base_block)))


def _backward(form, q, k, v, beta, do, h0, dht, chunk_size=1, solve="forward_substitution", base_block=16,
              scalar="double"):
    return from_core(core().delta_backward(scalar, form, *_inputs(q, k, v, beta, h0, scalar), to_core(do, scalar, "do"),
                                          to_core(dht, scalar, "dht"), int(chunk_size), solve, int(base_block)))


def recurrent(q, k, v, beta, h0=None, scalar="double"):
    """Erase–write view: S_t = S_{t-1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ.  Result(o, ht)."""
    return _forward("recurrent", q, k, v, beta, h0, scalar=scalar)


def recurrent_read_correct_write(q, k, v, beta, h0=None, scalar="double"):
    """Read–correct–write view: e_t = v_t − S_{t-1} k_t, S_t = S_{t-1} + β_t e_t k_tᵀ.  Result(o, ht)."""
    return _forward("recurrent_read_correct_write", q, k, v, beta, h0, scalar=scalar)


def affine_scan(q, k, v, beta, h0=None, scalar="double"):
    """Affine-transition view, prefixes by the work-efficient tree scan.  Result(o, ht)."""
    return _forward("affine_scan", q, k, v, beta, h0, scalar=scalar)


def chunkwise(q, k, v, beta, chunk_size, h0=None, solve="forward_substitution", base_block=16, scalar="double"):
    """Per chunk A, T = A⁻¹, W = T diag(β) K, U = T diag(β) V, V̄ = U − W S_[c]ᵀ,
    O = Q S_[c]ᵀ + (Q Kᵀ ⊙ M) V̄, S_[c+1] = S_[c] + V̄ᵀ K.
    Result(o, ht, boundary_states, chunks) with chunks[c] = {A, T, W, U, v_new}."""
    return _forward("chunkwise", q, k, v, beta, h0, chunk_size, solve, base_block, scalar)


def parallel(q, k, v, beta, h0=None, solve="forward_substitution", base_block=16, scalar="double"):
    """The whole-sequence WY form (one chunk of C = L).  Same fields as chunkwise."""
    return _forward("parallel", q, k, v, beta, h0, 1, solve, base_block, scalar)


def recurrent_backward(q, k, v, beta, do, h0=None, dht=None, scalar="double"):
    """Reverse sweep of the recurrence: Result(dq, dk, dv, dbeta, dh0)."""
    return _backward("recurrent", q, k, v, beta, do, h0, dht, scalar=scalar)


def chunkwise_backward(q, k, v, beta, do, chunk_size, h0=None, dht=None, solve="forward_substitution",
                       base_block=16, scalar="double"):
    """Backward through the WY factors, chunk by chunk: Result(dq, dk, dv, dbeta, dh0)."""
    return _backward("chunkwise", q, k, v, beta, do, h0, dht, chunk_size, solve, base_block, scalar)


def parallel_backward(q, k, v, beta, do, h0=None, dht=None, solve="forward_substitution", base_block=16,
                      scalar="double"):
    """Backward of the whole-sequence WY form: Result(dq, dk, dv, dbeta, dh0)."""
    return _backward("parallel", q, k, v, beta, do, h0, dht, 1, solve, base_block, scalar)


def wy_recurrence(k, v, beta, scalar="double"):
    """One chunk's WY factors by Equation 7: Result(A, W, U) (A = I + strictly_lower(diag(β) K Kᵀ))."""
    return from_core(core().delta_wy(scalar, "recurrence", to_core(k, scalar), to_core(v, scalar),
                                    to_core(beta, scalar), "forward_substitution", 16))


def wy_factors(k, v, beta, solve="forward_substitution", base_block=16, scalar="double"):
    """One chunk's WY factors through T = A⁻¹ by the named solve: Result(A, T, W, U)."""
    return from_core(core().delta_wy(scalar, "solve", to_core(k, scalar), to_core(v, scalar), to_core(beta, scalar),
                                    solve, int(base_block)))


def invert_unit_lower(a, solve="forward_substitution", base_block=16, scalar="double"):
    """T = A⁻¹ for a unit lower-triangular A by the named solve."""
    return from_core(core().invert_unit_lower(scalar, to_core(a, scalar, "a"), solve, int(base_block)))


def invert_unit_lower_blocked(a, base_block=16, scalar="double"):
    """The blocked solve with its levels: Result(T, diagonal_block_inverses, merged_levels). A is padded
    with I to base·2^m; diagonal_block_inverses are the base×base blocks' inverses (forward
    substitution) and merged_levels[l][j] the inverse of diagonal block j of size base·2^(l+1), each
    merged from two halves by T21 = −T22 A21 T11."""
    return from_core(core().invert_unit_lower_blocked(scalar, to_core(a, scalar, "a"), int(base_block)))


PREFIX_METHODS = ("sequential", "tree", "wy")


def prefix_products(k, v, beta, method="sequential", scalar="double"):
    """One chunk's prefix maps S ↦ S P_r + H_r for r = 1..C: a list of Result(P, H), P (DK, DK), H (DV, DK).
    method "sequential": dense products of M_r = I − β_r k_r k_rᵀ, X_r = β_r v_r k_rᵀ in token order;
    "tree": the same prefixes by the work-efficient tree scan; "wy": P_r = I − Σ_{i≤r} w_i k_iᵀ,
    H_r = Σ_{i≤r} u_i k_iᵀ from Equation 7's factors."""
    return from_core(core().delta_prefix_products(scalar, method, to_core(k, scalar, "k"), to_core(v, scalar, "v"),
                                                 to_core(beta, scalar, "beta")))


def conditioning(q, k, v, beta, chunk_sizes, h0=None, float_type="float"):
    """reference/delta_conditioning.hpp: for each chunk size, max|T|, max|W|, max|U| over the chunks (from
    the exact T, W, U) and the error of the chunkwise form and of the token recurrence evaluated in
    float_type ("float" or "double") against the exact oracle, on the same inputs (taken exactly; give
    values representable in float_type). A list of dicts: chunk_size, max_abs_t, max_abs_w, max_abs_u,
    chunkwise_relative_l2, chunkwise_max_abs, chunkwise_worst_row, recurrence_relative_l2,
    recurrence_worst_row, chunkwise_finite, recurrence_finite, max_abs_output (inf errors: overflow)."""
    return core().delta_conditioning(float_type, *_inputs(q, k, v, beta, h0, "exact"), [int(c) for c in chunk_sizes])


FORMS = {"recurrent": recurrent, "recurrent_read_correct_write": recurrent_read_correct_write,
         "affine_scan": affine_scan, "chunkwise": chunkwise, "parallel": parallel}
