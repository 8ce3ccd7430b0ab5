"""A kernel tested with deltaproof's pytest plugin.

    pytest python/examples/linear_attention_kernel_test.py                         # deltaproof installed
    pytest -p deltaproof.pytest_plugin python/examples/linear_attention_kernel_test.py  # a build tree on PYTHONPATH

`linear_attention` stands for the kernel under test: causal linear attention, chunkwise in float32
as a GPU kernel computes it, in fla's layout. The fixture draws cases (lengths around the chunk
size, odd head dims, varlen batches, h0, bf16 and fp32), judges each output against the exact
oracle and, on a failure, shrinks it to the smallest failing case.
"""
import numpy as np

from deltaproof.dtypes import round_to


def linear_attention(args):
    """q, k [B, T, H, K], v [B, T, H, V], h0 and ht [N, H, K, V]; varlen through cu_seqlens;
    scale None means the default 1/sqrt(K)."""
    f32 = np.float32
    B, T, H, K = np.shape(args["q"])
    scale = K ** -0.5 if args["scale"] is None else args["scale"]
    q = np.asarray(args["q"], f32) * f32(scale)
    k, v = np.asarray(args["k"], f32), np.asarray(args["v"], f32)
    h0, cu, C = args.get("h0"), args["cu_seqlens"], int(args["chunk_size"])
    V = v.shape[-1]
    spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)] if cu is not None else [(b, 0, T) for b in range(B)]
    o, ht = np.zeros(v.shape, f32), np.zeros((len(spans), H, K, V), f32)
    for n, (b, start, stop) in enumerate(spans):
        for h in range(H):
            state = np.zeros((K, V), f32) if h0 is None else np.asarray(h0[n, h], f32)
            for c0 in range(start, stop, C):
                c1 = min(c0 + C, stop)
                qc, kc, vc = q[b, c0:c1, h], k[b, c0:c1, h], v[b, c0:c1, h]
                causal = np.tril(np.ones((c1 - c0, c1 - c0), f32))
                o[b, c0:c1, h] = qc @ state + ((qc @ kc.T) * causal) @ vc
                state = state + kc.T @ vc
            ht[n, h] = state
    return {"o": round_to(o, args["dtype"]), "ht": ht}


def test_linear_attention_agrees_with_the_oracle(deltaproof_check):
    deltaproof_check(linear_attention, op="linear", dtypes=("bf16", "fp32"), backward=False, max_cases=12)
