"""Gated DeltaNet, one head: S_t = α_t S_{t-1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t.

Every function binds reference/gated_delta_rule.hpp. The α-form takes the gates α (L,) themselves,
so it stays exact over ℚ; the log-gate path takes g = ln α (L,) the way kernels do (cumulative sums,
exp(G_e − G_s)) and exists in "double" and "high" only. Shapes and ``solve`` as in delta_rule.
"""
from ._backend import core
from ._convert import from_core, to_core


def _inputs(q, k, v, beta, gate, h0, scalar):
    return (to_core(q, scalar, "q"), to_core(k, scalar, "k"), to_core(v, scalar, "v"),
            to_core(beta, scalar, "beta"), to_core(gate, scalar, "gate"), to_core(h0, scalar, "h0"))


def _forward(form, q, k, v, beta, alpha, h0, chunk_size=1, solve="forward_substitution", base_block=16,
             scalar="double"):
    return from_core(core().gated_forward(scalar, form, *_inputs(q, k, v, beta, alpha, h0, scalar), int(chunk_size),
                                         solve, int(base_block)))


def _backward(form, q, k, v, beta, alpha, do, h0, dht, chunk_size=1, solve="forward_substitution", base_block=16,
              scalar="double"):
    return from_core(core().gated_backward(scalar, form, *_inputs(q, k, v, beta, alpha, h0, scalar),
                                          to_core(do, scalar, "do"), to_core(dht, scalar, "dht"), int(chunk_size),
                                          solve, int(base_block)))


def recurrent(q, k, v, beta, alpha, h0=None, scalar="double"):
    """Erase–write view: S_t = α_t S_{t-1}(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ.  Result(o, ht)."""
    return _forward("recurrent", q, k, v, beta, alpha, h0, scalar=scalar)


def recurrent_read_correct_write(q, k, v, beta, alpha, h0=None, scalar="double"):
    """Read–correct–write on the decayed state S̃ = α_t S_{t-1}.  Result(o, ht)."""
    return _forward("recurrent_read_correct_write", q, k, v, beta, alpha, h0, scalar=scalar)


def affine_scan(q, k, v, beta, alpha, h0=None, scalar="double"):
    """Affine-transition view, M_r = α_r (I − β_r k_r k_rᵀ), by the tree scan.  Result(o, ht)."""
    return _forward("affine_scan", q, k, v, beta, alpha, h0, scalar=scalar)


def chunkwise(q, k, v, beta, alpha, chunk_size, h0=None, solve="forward_substitution", base_block=16,
              scalar="double"):
    """Gate-decayed WY chunkwise form.  Result(o, ht, boundary_states, chunks) with
    chunks[c] = {A, T, W, U, v_new, decay} (decay = Γ, (C+1, C+1))."""
    return _forward("chunkwise", q, k, v, beta, alpha, h0, chunk_size, solve, base_block, scalar)


def parallel(q, k, v, beta, alpha, h0=None, solve="forward_substitution", base_block=16, scalar="double"):
    """The whole-sequence gated WY form (one chunk of C = L)."""
    return _forward("parallel", q, k, v, beta, alpha, h0, 1, solve, base_block, scalar)


def recurrent_backward(q, k, v, beta, alpha, do, h0=None, dht=None, scalar="double"):
    """Reverse sweep: Result(dq, dk, dv, dbeta, dalpha, dh0)."""
    return _backward("recurrent", q, k, v, beta, alpha, do, h0, dht, scalar=scalar)


def chunkwise_backward(q, k, v, beta, alpha, do, chunk_size, h0=None, dht=None, solve="forward_substitution",
                       base_block=16, scalar="double"):
    """Backward through the gated WY form: Result(dq, dk, dv, dbeta, dalpha, dh0)."""
    return _backward("chunkwise", q, k, v, beta, alpha, do, h0, dht, chunk_size, solve, base_block, scalar)


def parallel_backward(q, k, v, beta, alpha, do, h0=None, dht=None, solve="forward_substitution", base_block=16,
                      scalar="double"):
    """Backward of the whole-sequence form: Result(dq, dk, dv, dbeta, dalpha, dh0)."""
    return _backward("parallel", q, k, v, beta, alpha, do, h0, dht, 1, solve, base_block, scalar)


def chunkwise_log_gate(q, k, v, beta, g, chunk_size, h0=None, solve="forward_substitution", base_block=16,
                       scalar="double"):
    """The kernels' path: g = ln α, decays exp(G_e − G_s) ("double" or "high").  Fields as chunkwise."""
    return from_core(core().gated_log_gate_forward(scalar, *_inputs(q, k, v, beta, g, h0, scalar), int(chunk_size),
                                                  solve, int(base_block)))


def chunkwise_log_gate_backward(q, k, v, beta, g, do, chunk_size, h0=None, dht=None, solve="forward_substitution",
                                base_block=16, scalar="double"):
    """Backward of the log-gate path: Result(dq, dk, dv, dbeta, dg, dh0) with dg = dL/dg."""
    return from_core(core().gated_log_gate_backward(scalar, *_inputs(q, k, v, beta, g, h0, scalar),
                                                   to_core(do, scalar, "do"), to_core(dht, scalar, "dht"),
                                                   int(chunk_size), solve, int(base_block)))


def wy_recurrence(k, v, beta, alpha, scalar="double"):
    """One chunk's gated Equation 7: Result(decay, A, W, U)."""
    return from_core(core().gated_wy(scalar, to_core(k, scalar), to_core(v, scalar), to_core(beta, scalar),
                                    to_core(alpha, scalar)))


def decay_from_gates(alpha, scalar="double"):
    """One chunk's decays Γ(e, s) = Π_{s<j≤e} α_j as products (no division), (C+1, C+1), zero above the
    diagonal; exact over ℚ with scalar="exact"."""
    return from_core(core().gated_decay(scalar, "gates", to_core(alpha, scalar, "alpha")))


def decay_from_log_gates(g, scalar="double"):
    """The kernels' decays: G_e = Σ_{j≤e} g_j (G_0 = 0), Γ(e, s) = exp(G_e − G_s) for e ≥ s only (the
    exponent is never positive), zero above; (C+1, C+1). scalar "float" (float32; g rounded to float32),
    "double" or "high"."""
    core_scalar = "double" if scalar == "float" else scalar
    return from_core(core().gated_decay(scalar, "log_gates", to_core(g, core_scalar, "g")))


def additive_recurrent(q, k, v, alpha, h0=None, scalar="double"):
    """Scalar-gated linear attention: S_t = α_t S_{t-1} + v_t k_tᵀ.  Result(o, ht)."""
    return from_core(core().gated_additive_forward(scalar, "recurrent", to_core(q, scalar), to_core(k, scalar),
                                                  to_core(v, scalar), to_core(alpha, scalar), to_core(h0, scalar), 1))


def additive_chunkwise(q, k, v, alpha, chunk_size, h0=None, scalar="double"):
    """O = diag(γ) Q S_[c]ᵀ + (Q Kᵀ ⊙ D) V,  S_[c+1] = γ_C S_[c] + Vᵀ diag(λ) K.  Result(o, ht, boundary_states)."""
    return from_core(core().gated_additive_forward(scalar, "chunkwise", to_core(q, scalar), to_core(k, scalar),
                                                  to_core(v, scalar), to_core(alpha, scalar), to_core(h0, scalar),
                                                  int(chunk_size)))


FORMS = {"recurrent": recurrent, "recurrent_read_correct_write": recurrent_read_correct_write,
         "affine_scan": affine_scan, "chunkwise": chunkwise, "parallel": parallel}
