"""The three ops the way production kernels run them, in numpy: for DeltaNet and Gated DeltaNet fla's
WY chunkwise algorithm (chunk_scaled_dot_kkt, solve_tril, recompute_w_u, chunk_delta_h, chunk_o), for
linear attention fla's chunk_linear_attn (chunk_fwd_h, chunk_fwd_o), with every matrix-product operand
rounded to the input dtype (bf16 or fp16 tensor-core operands), products and sums in float32 (fp32
accumulation), and the running state kept in float32 between chunks, or in a 16-bit dtype when
`state_dtype` says so. Forward only; fla's layout ([B, T, H, D], states [N, H, DK, DV]), fixed-length
and varlen.

Linear attention, per chunk (q already scale·q rounded, as every op here):
  O = Q S_[c]ᵀ + (Q Kᵀ ⊙ M) V                 (S_[c] rounded as an operand, the score matrix rounded)
  S_[c+1] = S_[c] + Vᵀ K                       (fp32: 16-bit products are exact; rounded to state_dtype when asked)

Per chunk of n tokens (K (n, DK), V (n, DV), β (n), log-gates g (n), cumulative G = cumsum g):
  A = strictly-lower(diag(β) K Kᵀ ⊙ Γ),  Γ_ij = exp(G_i − G_j)       (fp32, operands k)
  T = (I + A)⁻¹                                                      (fp32 forward substitution, stored rounded)
  W = T (diag(β e^G) K),  U = T (diag(β) V)                          (stored rounded)
  V̄ = U − W S_[c]ᵀ                                                   (S_[c] rounded as an operand; V̄ stored rounded)
  O = e^G ⊙ Q S_[c]ᵀ + (Q Kᵀ ⊙ Γ ⊙ M) V̄                              (the score matrix rounded as an operand)
  S_[c+1] = e^{G_n} S_[c] + V̄ᵀ (diag(e^{G_n − G}) K)                 (fp32; rounded to state_dtype when asked)
The state here is deltaproof's S (DV, DK); fla stores its transpose.
"""
import numpy as np

from deltaproof.dtypes import canonical, round_to

f32 = np.float32


def _operand(x, dtype):
    """x rounded to the tensor-core operand dtype, as float32 (which holds every bf16 and fp16 value)."""
    if dtype == "fp32":
        return np.asarray(x, f32)
    return np.asarray(round_to(np.asarray(x, f32), dtype), f32)


def _solve_unit_lower(A):
    """T = (I + A)⁻¹ for strictly lower A, by forward substitution in float32 (rows in order)."""
    n = A.shape[0]
    T = np.eye(n, dtype=f32)
    for i in range(1, n):
        T[i, :i] = -(A[i, :i] @ T[:i, :i]).astype(f32)
    return T


def wy_chunk(q, k, v, beta, g, state, dtype, state_dtype):
    """One chunk (q, k (n, DK); v (n, DV); beta, g (n) or None; state (DV, DK) float32): (o, new state)."""
    r = lambda x: _operand(x, dtype)
    n = q.shape[0]
    if g is not None:
        G = np.cumsum(g.astype(f32), dtype=f32)
        gamma = np.exp(G).astype(f32)
        diff = G[:, None] - G[None, :]
        decay = np.exp(np.where(np.tril(np.ones((n, n), bool)), diff, -np.inf)).astype(f32)  # Γ ⊙ M (lower, diagonal 1)
        tail = np.exp(G[-1] - G).astype(f32)
        end = f32(np.exp(G[-1]))
    else:
        gamma = np.ones(n, f32)
        decay = np.tril(np.ones((n, n), f32))
        tail = np.ones(n, f32)
        end = f32(1)
    A = np.tril((beta[:, None] * (k @ k.T)).astype(f32) * decay, -1).astype(f32)  # chunk_scaled_dot_kkt
    T = r(_solve_unit_lower(A))                                                      # solve_tril, stored
    W = r(T @ r(k * (beta * gamma)[:, None]))                                       # recompute_w_u
    U = r(T @ r(v * beta[:, None]))
    s_op = r(state)
    V_new = r(U - (W @ s_op.T).astype(f32))                                          # chunk_delta_h
    scores = r((q @ k.T).astype(f32) * decay)                                        # chunk_o
    o = (gamma[:, None] * (q @ s_op.T)).astype(f32) + (scores @ V_new).astype(f32)
    state = (end * state + (V_new.T @ r(k * tail[:, None])).astype(f32)).astype(f32)
    if state_dtype != "fp32":
        state = _operand(state, state_dtype)
    return o.astype(f32), state


def linear_chunk(q, k, v, state, dtype, state_dtype):
    """One chunk of linear attention (q scaled and rounded; state (DV, DK) float32): (o, new state)."""
    r = lambda x: _operand(x, dtype)
    n = q.shape[0]
    s_op = r(state)
    scores = r(np.tril((q @ k.T).astype(f32)))                                       # chunk_fwd_o
    o = (q @ s_op.T).astype(f32) + (scores @ v).astype(f32)
    state = (state + (v.T @ k).astype(f32)).astype(f32)                              # chunk_fwd_h
    if state_dtype != "fp32":
        state = _operand(state, state_dtype)
    return o.astype(f32), state


def wy_chunkwise_kernel(state_dtype=None):
    """A check_kernel kernel (fn(args) -> {"o", "ht"}) for every op (DeltaNet and Gated DeltaNet in the WY
    form, linear attention in fla's chunk form), blhd layout. state_dtype: None keeps the running state in
    float32 (fla's); "bf16"/"fp16" rounds it at every chunk boundary (what the judge's state_dtype option
    describes)."""

    def kernel(args):
        op, C, dtype = args["op"], int(args["chunk_size"]), canonical(args["dtype"])
        if op not in ("linear", "delta", "gated-delta") or args["layout"] != "blhd":
            raise ValueError("wy_chunkwise_kernel: linear, delta or gated-delta, blhd layout")
        sd = canonical(state_dtype) if state_dtype is not None else "fp32"
        r = lambda x: _operand(x, dtype)
        scale = args.get("scale", 1.0)
        if scale is None:  # fla's default
            scale = np.shape(args["q"])[-1] ** -0.5
        q = r(np.asarray(args["q"], f32) * f32(scale))
        k, v = r(args["k"]), r(args["v"])
        beta = np.asarray(args["beta"], f32) if op != "linear" else None
        g = np.asarray(args["g"], f32) if op == "gated-delta" else None
        h0 = args.get("h0")
        cu = args.get("cu_seqlens")
        B, T, H, K = q.shape
        V = v.shape[-1]
        spans = ([(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)] if cu is not None
                 else [(b, 0, T) for b in range(B)])
        o = np.zeros((B, T, H, V), f32)
        ht = np.zeros((len(spans), H, K, V), f32)
        for h in range(H):
            for n, (b, start, stop) in enumerate(spans):
                state = (np.asarray(h0[n, h], f32).T.copy() if h0 is not None else np.zeros((V, K), f32))
                for c0 in range(start, stop, C):
                    c1 = min(c0 + C, stop)
                    if op == "linear":
                        out, state = linear_chunk(q[b, c0:c1, h], k[b, c0:c1, h], v[b, c0:c1, h], state, dtype, sd)
                    else:
                        out, state = wy_chunk(q[b, c0:c1, h], k[b, c0:c1, h], v[b, c0:c1, h], beta[b, c0:c1, h],
                                              None if g is None else g[b, c0:c1, h], state, dtype, sd)
                    o[b, c0:c1, h] = out
                ht[n, h] = state.T
        return {"o": np.asarray(round_to(o, dtype), np.float64), "ht": np.asarray(ht, np.float64)}

    kernel.__name__ = f"wy_chunkwise[state {state_dtype or 'fp32'}]"
    return kernel


OPS = ("linear", "delta", "gated-delta")


def sweep(ops=OPS, cases=200, seed=0, dtypes=("bf16", "fp16", "fp32"), state_dtype=None, log=None):
    """check_kernel's cases for these kernels, judged with verify::judge (chunk size not told, so every
    chunking of up to 64 tokens is covered): per op, how many cases agree, disagree or are
    inconclusive, the largest err/bound and where. Forward only (the kernel has no backward)."""
    import time

    from deltaproof import check
    from deltaproof.verdict import judge

    fn = wy_chunkwise_kernel(state_dtype)
    out = {}
    for op in ops:
        counts = {"agree": 0, "disagree": 0, "inconclusive": 0}
        worst = {"ratio": 0.0}
        rejected, undecided = [], []
        started = time.perf_counter()
        for case in check.draw_cases(op, dtypes=dtypes, max_cases=cases, seed=seed, backward=False):
            args = check.kernel_arguments(case)
            outputs = fn(dict(args))
            tensors = {k: v for k, v in args.items() if k in ("q", "k", "v", "beta", "g", "h0")}
            v = judge(op, tensors, outputs, layout=case.layout, dtype=case.dtype, cu_seqlens=case.cu_seqlens,
                      scale=case.judged_scale, state_dtype=state_dtype)
            counts[v.status] += 1
            if v.status == "disagree":
                rejected.append(case.describe())
            if v.status == "inconclusive":
                undecided.append({"case": case.describe(), "premise": v.premise["text"]})
            for row in v.comparisons:
                if row["status"] != "inconclusive" and row["ratio"] is not None and row["ratio"] > worst["ratio"]:
                    worst = {"ratio": row["ratio"], "tensor": row["tensor"], "case": case.describe()}
            if log:
                log(f"{op} {case.describe()}: {v.status}")
        out[op] = {"cases": sum(counts.values()), **counts, "largest_ratio": worst, "rejected": rejected,
                   "inconclusive_cases": undecided, "seconds": round(time.perf_counter() - started, 1)}
    return out


def sweep_seeds(seeds, cases=48, state_dtype=None, ops=OPS):
    """`sweep` over seeds 0 .. seeds − 1 (check_kernel's default 48 cases each), summed per op: the
    counts, the largest err/bound and where, every rejected and every inconclusive case."""
    total = {}
    for seed in range(seeds):
        for op, r in sweep(ops=ops, cases=cases, seed=seed, state_dtype=state_dtype).items():
            t = total.setdefault(op, {"seeds": 0, "cases": 0, "agree": 0, "disagree": 0, "inconclusive": 0,
                                      "largest_ratio": {"ratio": 0.0}, "rejected": [], "inconclusive_cases": []})
            t["seeds"] += 1
            for k in ("cases", "agree", "disagree", "inconclusive"):
                t[k] += r[k]
            if r["largest_ratio"]["ratio"] > t["largest_ratio"]["ratio"]:
                t["largest_ratio"] = r["largest_ratio"]
            t["rejected"] += r["rejected"]
            t["inconclusive_cases"] += r["inconclusive_cases"]
    return total


if __name__ == "__main__":
    import argparse
    import json
    import os
    import platform
    import subprocess
    import datetime
    import warnings

    parser = argparse.ArgumentParser(description="verify::judge on the numpy production-style kernels over check_kernel's cases")
    parser.add_argument("--cases", type=int, default=48, help="cases per seed (check_kernel's default: 48)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0 .. N-1")
    parser.add_argument("--state-dtype", default=None)
    parser.add_argument("--ops", default=",".join(OPS), help="comma-separated, of " + ", ".join(OPS))
    a = parser.parse_args()
    ops = tuple(a.ops.split(","))
    warnings.simplefilter("ignore", RuntimeWarning)  # fp16 WY products overflow in some regimes: judged inconclusive
    result = sweep_seeds(a.seeds, cases=a.cases, state_dtype=a.state_dtype, ops=ops)
    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here).stdout.strip()
    print(json.dumps({"provenance": {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
        "gpu": f"none (CPU only: {platform.machine()}, {os.cpu_count()} cores)",
        "versions": {"python": platform.python_version(), "numpy": np.__version__},
        "command": f"PYTHONPATH=build/release/python python3 python/tests/production_kernels.py --seeds {a.seeds} "
                   f"--cases {a.cases}" + (f" --state-dtype {a.state_dtype}" if a.state_dtype else "")
                   + (f" --ops {a.ops}" if ops != OPS else "")},
        "result": result}, indent=1))
