"""The vocabulary and the cost model of the report: ops, passes, shapes and peaks of the GPU the
records were measured on, FLOPs and compulsory bytes per call, the roofline bound and the two-term
latency model of the chunk scans (derivations: proofs/linear_attention.md §2-3, proofs/delta_rule.md
§3-6). Pure functions of numbers; no file is read here."""
import math
from collections import OrderedDict

import numpy as np

# The NVIDIA H200 the GPU records were measured on: bf16 dense GEMM and device-to-device copy,
# measured on that card.
PEAK_FLOPS = 790e12
PEAK_BYTES_PER_S = 4.3e12
H200_SMS = 132
# Shapes of the CUDA benchmarks (bench_*_cuda.cpp: kBatch, kHeads, kLength, kDim; decode: B and
# T from the run's name). The FLOP and byte counters in their JSON are checked against the model
# at these shapes (section "Counters against the model").
GPU_SHAPE = dict(B=8, H=16, L=4096, DK=128, DV=128)
GPU_DECODE_SHAPE = dict(H=16, T=1, DK=128, DV=128)
CHUNK_SIZES = (16, 32, 64)

OPS = OrderedDict([("linear", "Linear attention"), ("delta", "DeltaNet"), ("gated-delta", "Gated DeltaNet")])
PASSES = ("forward", "backward", "forward+backward", "prepare stage", "scan stage", "decode")
# Passes whose deltaproof kernel walks each head's chunks in order (the latency model applies).
SEQUENTIAL_PASSES = {"forward", "backward", "forward+backward", "scan stage"}
PEERS = ("fla", "article")

# The performance targets (the design page in docs/): ratios measured in one run, and goals.
RATIO_TARGETS = {("linear", "forward"): ("fla", 0.65), ("linear", "forward+backward"): ("fla", 0.65),
                 ("delta", "forward"): ("fla", 0.9), ("gated-delta", "forward"): ("fla", 0.9),
                 ("linear", "decode"): ("article", 1.0)}
GOALS_US = {("linear", "forward"): 210, ("linear", "forward+backward"): 1000, ("delta", "forward"): 500,
            ("delta", "forward+backward"): 1500, ("gated-delta", "forward"): 520,
            ("gated-delta", "forward+backward"): 1600, ("linear", "decode"): 34, ("delta", "decode"): 34,
            ("gated-delta", "decode"): 34}

# ---------------------------------------------------------------------------------------------
# The cost model (derivations: proofs/linear_attention.md §2-3, proofs/delta_rule.md §3-6).
# FLOPs are algorithmic: a multiply-add counts 2, the causal mask saves nothing. Bytes are
# compulsory: every input read once and every output written once, states left out (≤ 2 %).
# ---------------------------------------------------------------------------------------------

def model_flops(op, pass_, s, C):
    """FLOPs of one call on shape s (B, H, L or T, DK, DV) at chunk size C; None where no model."""
    B, H, DK, DV = s["B"], s["H"], s["DK"], s["DV"]
    if pass_ == "decode":  # S += v kᵀ and S q (linear); S k, the rank-one correction and S q (delta)
        return B * H * s["T"] * (4 if op == "linear" else 6) * DK * DV
    tokens = B * H * s["L"]
    if op == "linear":
        # Q Kᵀ and (·⊙M) V inside each chunk, Q S_[c]ᵀ and S_[c+1] = S_[c] + V_[c]ᵀ K_[c] across chunks.
        forward = tokens * (2 * C * (DK + DV) + 4 * DK * DV)
        # Three forward-shaped scans: dQ over (dO, V, K), dK over (V, dO, Q), dV over (K, Q, dO).
        return {"forward": forward, "backward": 3 * forward, "forward+backward": 4 * forward}.get(pass_)
    # K Kᵀ, W = T diag(β) K, U = T diag(β) V, and T = A⁻¹ by substitution (C³/3 per chunk).
    prepare = tokens * (2 * C * DK + 2 * C * DK + 2 * C * DV + C * C / 3)
    # V̄ = U − W S_[c]ᵀ, Q S_[c]ᵀ, S_[c+1] = S_[c] + V̄ᵀ K (2·DK·DV each), Q Kᵀ and (·⊙M) V̄.
    scan = tokens * (2 * C * DK + 2 * C * DV + 6 * DK * DV)
    forward = prepare + scan
    # The backward takes only the inputs: the forward recomputed, then each product's adjoint (two
    # products of its size, one per operand): 3 × forward, as for linear attention.
    return {"forward": forward, "backward": 3 * forward, "forward+backward": 4 * forward, "prepare stage": prepare,
            "scan stage": scan}.get(pass_)


def model_bytes(op, pass_, s, C, element=2):
    """Compulsory bytes of one call: inputs read and outputs written once (16-bit tensors, fp32 g)."""
    B, H, DK, DV = s["B"], s["H"], s["DK"], s["DV"]
    beta = element if op != "linear" else 0
    gate = 4 if op == "gated-delta" else 0
    if pass_ == "decode":  # the fp32 state in and out, and one token's q, k, v, β, g, o
        return B * H * (8 * DK * DV + s["T"] * (element * (2 * DK + 2 * DV) + beta + gate))
    tokens = B * H * s["L"]
    forward = tokens * (element * (2 * DK + 2 * DV) + beta + gate)  # q, k, v (β, g) in; o out
    backward = tokens * (element * (4 * DK + 3 * DV) + 2 * beta + 2 * gate)  # q, k, v, dO (β, g) in; dq, dk, dv (dβ, dg) out
    return {"forward": forward, "backward": backward, "forward+backward": forward + backward,
            "prepare stage": tokens * (element * (2 * DK + 2 * DV) + beta + gate),  # k, v (β, g) in; w, u out
            "scan stage": tokens * (element * (3 * DK + 2 * DV) + gate),  # q, k, w, u (g) in; o out
            }.get(pass_)


def roofline_us(op, pass_, s, C):
    """max(FLOPs / peak, bytes / bandwidth) in µs: no kernel can be faster."""
    f, b = model_flops(op, pass_, s, C), model_bytes(op, pass_, s, C)
    if b is None:
        return None
    return max((f or 0) / PEAK_FLOPS, b / PEAK_BYTES_PER_S) * 1e6


def chunk_steps(s, C):
    return math.ceil(s["L"] / C)


def fit_latency(points, op, pass_, s):
    """Fits T(C) = τ·⌈L/C⌉ + F(C)/R by least squares: τ the fixed cost of one chunk step (the
    sequential scan pays it L/C times), R the rate at which the work itself runs. Returns a dict
    (tau_us, rate, max_residual, points) or None with fewer than two chunk sizes."""
    cs = sorted(points)
    if len(cs) < 2:
        return None
    a = np.array([[chunk_steps(s, C), model_flops(op, pass_, s, C) / 1e6] for C in cs])  # µs·FLOP/µs
    t = np.array([points[C] for C in cs])
    (tau, inv_rate), *_ = np.linalg.lstsq(a, t, rcond=None)
    fitted = a @ np.array([tau, inv_rate])
    ok = tau >= 0 and inv_rate > 0
    # inv_rate is in µs per MFLOP, so R = 10⁶ FLOP / (inv_rate · 10⁻⁶ s).
    return dict(tau_us=float(tau), rate=1e12 / float(inv_rate) if inv_rate > 0 else float("nan"),
                inv_rate=float(inv_rate), max_residual=float(np.max(np.abs(fitted - t) / t)), points=len(cs), ok=ok)


def latency_us(fit, op, pass_, s, C):
    return fit["tau_us"] * chunk_steps(s, C) + fit["inv_rate"] * model_flops(op, pass_, s, C) / 1e6

