"""Additive linear attention, one head: S_t = S_{t-1} + v_t k_tᵀ, o_t = S_t q_t.

Every function binds reference/linear_attention.hpp. Shapes: q, k (L, DK); v, do (L, DV); states
h0, ht, dht (DV, DK) value-by-key. ``scalar`` is "double", "high" (100-digit MPFR, returned rounded
to float64) or "exact" (GMP rationals: inputs converted exactly, results as Fraction object arrays).
"""
from fractions import Fraction

from ._backend import core
from ._convert import from_core, to_core


def _inputs(q, k, v, h0, scalar):
    return (to_core(q, scalar, "q"), to_core(k, scalar, "k"), to_core(v, scalar, "v"), to_core(h0, scalar, "h0"))


def _forward(form, q, k, v, h0, chunk_size, scalar):
    return from_core(core().la_forward(scalar, form, *_inputs(q, k, v, h0, scalar), int(chunk_size)))


def _backward(form, q, k, v, do, h0, dht, chunk_size, scalar):
    return from_core(core().la_backward(scalar, form, *_inputs(q, k, v, h0, scalar), to_core(do, scalar, "do"),
                                       to_core(dht, scalar, "dht"), int(chunk_size)))


def parallel(q, k, v, h0=None, scalar="double"):
    """O = Q S_0ᵀ + (Q Kᵀ ⊙ M) V,  S_L = S_0 + Vᵀ K.  Returns Result(o, ht)."""
    return _forward("parallel", q, k, v, h0, 1, scalar)


def recurrent(q, k, v, h0=None, scalar="double"):
    """S_t = S_{t-1} + v_t k_tᵀ,  o_t = S_t q_t.  Returns Result(o, ht)."""
    return _forward("recurrent", q, k, v, h0, 1, scalar)


def chunkwise(q, k, v, chunk_size, h0=None, scalar="double"):
    """The derivation's Equation 4 over chunks of chunk_size tokens (last one may be partial).
    Returns Result(o, ht, boundary_states) with boundary_states[c] = S_[c], the state before chunk c."""
    return _forward("chunkwise", q, k, v, h0, chunk_size, scalar)


def parallel_backward(q, k, v, do, h0=None, dht=None, scalar="double"):
    """Gradients of <do, O> + <dht, S_L>: Result(dq, dk, dv, dh0)."""
    return _backward("parallel", q, k, v, do, h0, dht, 1, scalar)


def recurrent_backward(q, k, v, do, h0=None, dht=None, scalar="double"):
    """Reverse sweep of the recurrence: Result(dq, dk, dv, dh0)."""
    return _backward("recurrent", q, k, v, do, h0, dht, 1, scalar)


def chunkwise_backward(q, k, v, do, chunk_size, h0=None, dht=None, scalar="double"):
    """Reverse scan of boundary-state gradients, then per chunk: Result(dq, dk, dv, dh0)."""
    return _backward("chunkwise", q, k, v, do, h0, dht, chunk_size, scalar)


def time_forward(q, k, v, form, chunk_size=1, h0=None, repeats=5):
    """Seconds taken by each of `repeats` evaluations of one forward form in double on one core, timed in
    C++ around the form alone (inputs converted beforehand, nothing returned to numpy). A list of floats."""
    return core().la_time_forward(form, *_inputs(q, k, v, h0, "double"), int(chunk_size), int(repeats))


DERIVATIVE_METHODS = ("dual", "backward", "central_difference")


def directional_derivative(q, k, v, do, direction, form="chunkwise", chunk_size=1, h0=None, dht=None,
                           method="dual", step=None):
    """∇L·u for L = <do, O> + <dht, S_L>, along direction u = (u_q, u_k, u_v[, u_h0]), as a Fraction.

    Inputs are taken exactly. method "dual": dual numbers through the form (exact); "backward": the
    form's backward path paired with u (exact); "central_difference": (L(x + h u) − L(x − h u)) / 2h in
    High (100 digits) with h = step (a Fraction, int or float, converted to High), the High result
    returned as the exact rational it is. chunk_size matters for form "chunkwise" only."""
    if method not in DERIVATIVE_METHODS:
        raise ValueError(f"method: expected one of {DERIVATIVE_METHODS} (got {method!r})")
    if (method == "central_difference") != (step is not None):
        raise ValueError("step: give it for method='central_difference' only")
    step = Fraction(step) if step is not None else Fraction(0)
    u = [to_core(x, "exact", "direction") for x in direction]
    value = core().la_directional_derivative(method, form, *_inputs(q, k, v, h0, "exact"), to_core(do, "exact", "do"),
                                             to_core(dht, "exact", "dht"), u, int(chunk_size),
                                             f"{step.numerator}/{step.denominator}")
    return from_core(value)[()]


FORMS = {"parallel": parallel, "recurrent": recurrent, "chunkwise": chunkwise}
BACKWARD = {"parallel": parallel_backward, "recurrent": recurrent_backward, "chunkwise": chunkwise_backward}
