"""A chunkwise kernel written in numpy float32 (fla's layout, varlen, all three ops), faithful by
default, with planted bugs as named switches for the tests that check check_kernel catches them.

Like a GPU kernel it multiplies the dtype-rounded inputs in float32, keeps the state in float32
(fla's fp32 h0/ht) and rounds o to the input dtype. Forward only.
"""
import numpy as np

from deltaproof.dtypes import round_to, round_to_bf16

BUGS = ("mask_off_by_one", "drop_partial_chunk", "lose_h0", "no_varlen_reset", "gate_wrong_token", "bf16_state")


def numpy_kernel(bug=None):
    if bug is not None and bug not in BUGS:
        raise ValueError(bug)
    f32 = np.float32

    def chunk_step(op, q, k, v, beta, g, state, mask):
        """One chunk: (o (C, DV), new state (DV, DK)) in float32."""
        n = q.shape[0]
        if op == "gated-delta":
            G = np.cumsum(g, dtype=f32)                                # G_r, (C,)
            gamma = np.exp(G).astype(f32)                              # γ_r
            D = np.exp(np.where(mask, G[:, None] - G[None, :], -np.inf)).astype(f32)  # D_ri = exp(G_r − G_i), 0 above
            lam = np.exp(G[-1] - G).astype(f32)                         # λ_i
            end = np.exp(G[-1]).astype(f32)
        else:
            gamma, D, lam, end = np.ones(n, f32), mask.astype(f32), np.ones(n, f32), f32(1)
        if op == "linear":
            v_new = v
        else:
            A = np.eye(n, dtype=f32) + np.tril((beta[:, None] * (k @ k.T)) * D, -1)
            T = np.eye(n, dtype=f32)                                    # A⁻¹ by forward substitution
            for i in range(n):
                for j in range(i):
                    T[i, j] = -(A[i, j:i] @ T[j:i, j])
            W = T @ ((beta * gamma)[:, None] * k)
            U = T @ (beta[:, None] * v)
            v_new = U - W @ state.T
        o = gamma[:, None] * (q @ state.T) + ((q @ k.T) * D) @ v_new
        state = end * state + v_new.T @ (lam[:, None] * k)
        return o.astype(f32), state.astype(f32)

    def kernel(args):
        op, C, dtype = args["op"], int(args["chunk_size"]), args["dtype"]
        assert args["layout"] == "blhd"
        q = np.asarray(args["q"], f32) * f32(args.get("scale", 1.0))
        k, v = np.asarray(args["k"], f32), np.asarray(args["v"], f32)
        beta = np.asarray(args["beta"], f32) if "beta" in args else None
        g = np.asarray(args["g"], f32) if "g" in args else None
        h0 = np.asarray(args["h0"], f32) if "h0" in args and args["h0"] is not None else None
        cu = args.get("cu_seqlens")
        B, T, H, K = q.shape
        V = v.shape[-1]
        spans = ([(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)] if cu is not None
                 else [(b, 0, T) for b in range(B)])
        o = np.zeros((B, T, H, V), f32)
        ht = np.zeros((len(spans), H, K, V), f32)
        for h in range(H):
            carried = None
            for n, (b, start, stop) in enumerate(spans):
                if h0 is not None and bug != "lose_h0":
                    state = h0[n, h].T.copy()                            # (DV, DK)
                else:
                    state = np.zeros((V, K), f32)
                if bug == "no_varlen_reset" and carried is not None:
                    state = carried
                gates = None if g is None else g[b, start:stop, h]
                if bug == "gate_wrong_token" and gates is not None and len(gates) > 1:
                    gates = np.roll(gates, 1)                            # token t decays with g_{t−1}
                for c0 in range(start, stop, C):
                    c1 = min(c0 + C, stop)
                    if bug == "drop_partial_chunk" and c1 - c0 < C:
                        continue
                    n_tok = c1 - c0
                    i, j = np.indices((n_tok, n_tok))
                    mask = j < i if bug == "mask_off_by_one" else j <= i
                    out, state = chunk_step(op, q[b, c0:c1, h], k[b, c0:c1, h], v[b, c0:c1, h],
                                            None if beta is None else beta[b, c0:c1, h],
                                            None if gates is None else gates[c0 - start:c1 - start], state, mask)
                    if bug == "bf16_state":
                        state = round_to_bf16(state)
                    o[b, c0:c1, h] = out
                ht[n, h] = state.T
                carried = state
        return {"o": np.asarray(round_to(o, dtype), np.float64), "ht": ht}

    kernel.__name__ = f"numpy_kernel[{bug or 'faithful'}]"
    return kernel
