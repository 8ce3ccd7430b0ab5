"""Kernels with bugs that only some combinations of case attributes show, for the tests that check
check_kernel draws those combinations: each is the numpy kernel of numpy_kernels.py with one policy
overridden (forward), or the oracle's own chunkwise form with one gradient changed (backward).

`with_oracle_gradients` completes a forward kernel with the oracle's gradients (in double), so that
forward bugs are checked at check_kernel's defaults (backward on).
"""
import numpy as np

import deltaproof
from deltaproof.dtypes import round_to
from numpy_kernels import Faithful, policy_kernel

GRADIENTS = ("dq", "dk", "dv", "dbeta", "dg", "dh0")


class ScaleOnKeys(Faithful):
    """Multiplies k instead of q by the scale: the same o at scale 1 (and for linear attention
    without h0 at any scale), a wrong state and wrong delta-rule updates otherwise."""
    name = "scale_on_keys"

    def scaled(self, q, k, scale):
        return q, k * np.float32(scale)


class DefaultScaleFromValueDim(Faithful):
    """Takes DV^-1/2 for its default scale: wrong only when given None and DK ≠ DV."""
    name = "default_scale_from_value_dim"

    def scale(self, given, key_dim, value_dim):
        return value_dim ** -0.5 if given is None else given


class StateInInputDtype(Faithful):
    """Keeps its running state in the input dtype between chunks (bf16 in bf16 cases, fp16 in fp16
    cases, fp32 in fp32 cases): only 16-bit cases can show it."""
    name = "state_in_input_dtype"

    def state_after_chunk(self, state, dtype):
        return np.asarray(round_to(state, dtype), np.float32) if dtype in ("bf16", "fp16") else state


class H0UntransposedInFp32(Faithful):
    """Its fp32 path reads h0 [N, H, DK, DV] as if it were [N, H, DV, DK]: only fp32 cases with h0
    (and DK, DV not both 1) show it."""
    name = "h0_untransposed_in_fp32"

    def initial_state(self, h0, n, h, dtype):
        if dtype != "fp32":
            return h0[n, h].T.copy()
        K, V = h0.shape[2], h0.shape[3]
        return h0[n, h].reshape(V, K).copy()


class GatesRestartAt32(Faithful):
    """At C = 64 it forms a chunk's cumulative log-gates as two 32-token sums, the second not
    carrying the first: only gated-delta with C = 64 and more than 32 tokens in a chunk shows it."""
    name = "gates_restart_at_32"

    def cumulative_gates(self, g, chunk_size):
        if chunk_size != 64:
            return np.cumsum(g, dtype=np.float32)
        return np.concatenate([np.cumsum(g[:32], dtype=np.float32), np.cumsum(g[32:], dtype=np.float32)])


FORWARD_BUGS = {p.name: p for p in (ScaleOnKeys, DefaultScaleFromValueDim, StateInInputDtype,
                                    H0UntransposedInFp32, GatesRestartAt32)}


def with_oracle_gradients(forward):
    """`forward`'s o and ht; where the inputs hold do, the oracle's gradients (chunkwise, double).
    They are not rounded to their storage dtypes: under very negative gates dg falls below fp32's
    normal range, and the judge's output rounding term is relative (no underflow term), so an fp32
    subnormal dg would disagree."""
    reference = deltaproof.reference_kernel("chunkwise")

    def kernel(args):
        out = dict(forward(dict(args)))
        if "do" in args:
            grads = reference(args)
            out.update({n: grads[n] for n in GRADIENTS if grads.get(n) is not None})
        return out

    kernel.__name__ = forward.__name__ + "+oracle gradients"
    return kernel


def planted_kernel(bug):
    """The numpy kernel with forward bug `bug` (FORWARD_BUGS), completed with the oracle's gradients."""
    return with_oracle_gradients(policy_kernel(FORWARD_BUGS[bug]()))


def faithful_kernel():
    return with_oracle_gradients(policy_kernel(Faithful()))


def dh0_without_dht_kernel():
    """The oracle's chunkwise form whose dh0 misses the cotangent dht carried back through the
    sequence (every other output right): only backward cases with both h0 and dht show it."""
    reference = deltaproof.reference_kernel("chunkwise")

    def kernel(args):
        out = reference(dict(args))
        if out.get("dh0") is not None and args.get("dht") is not None:
            out["dh0"] = reference({k: v for k, v in args.items() if k != "dht"})["dh0"]
        return out

    kernel.__name__ = "oracle[dh0 without dht]"
    return kernel


def fla_tuple_kernel(kernel):
    """`kernel` returning fla's tuple (o, ht, dq, dk, dv, [dg, dbeta | dbeta], dh0) instead of a dict."""

    def as_tuple(args):
        out = kernel(args)
        names = ["o", "ht", "dq", "dk", "dv"] + {"linear": [], "delta": ["dbeta"],
                                                 "gated-delta": ["dg", "dbeta"]}[args["op"]] + ["dh0"]
        values = [out.get(n) for n in names]
        while values and values[-1] is None:
            values.pop()
        return tuple(values)

    as_tuple.__name__ = kernel.__name__ + " as a tuple"
    return as_tuple
