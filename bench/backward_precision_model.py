#!/usr/bin/env python3
"""Which intermediates of the DeltaNet / Gated DeltaNet chunkwise backward may enter the tensor cores as one
bf16 rounding, and which need a hi + lo pair? A float64 model of the chunkwise forward and backward
(reference/delta_rule.hpp's equations, batched over heads with numpy) with a rounding hook at every
operand, run at the accuracy shape (bf16, B=2, H=4, L=512, D=128, C=64, the accuracy inputs,
dO ~ N(0,1)); prints each gradient's relative L2 against the same model without roundings, every
gradient finally stored in bf16. docs/kernels/delta_rule.md ("Backward on tensor cores") says what it chose.

    /usr/bin/python3 bench/backward_precision_model.py [gated]     # about a minute
"""
import sys

import numpy as np

rng = np.random.default_rng(0)


def bf16(x):
    """Round to nearest even in bf16 (through fp32)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def pair(x):
    """fp32 x as hi + lo in bf16."""
    x = np.asarray(x, np.float32).astype(np.float64)
    h = bf16(x)
    return h + bf16(x - h)


B, H, L, D, C = 2, 4, 512, 128, 64
gated = len(sys.argv) > 1 and sys.argv[1] == "gated"
q = bf16(rng.standard_normal((B * H, L, D)) / np.sqrt(D))
k = rng.standard_normal((B * H, L, D))
k = bf16(k / np.linalg.norm(k, axis=-1, keepdims=True))
v = bf16(rng.standard_normal((B * H, L, D)))
beta = bf16(1 / (1 + np.exp(-rng.standard_normal((B * H, L)))))
g = np.asarray(-np.logaddexp(0, -(rng.standard_normal((B * H, L)) + 3)), np.float32).astype(np.float64) if gated else np.zeros((B * H, L))
do = bf16(rng.standard_normal((B * H, L, D)))
N = L // C


def run(R):
    """R: operand name -> rounding applied where it enters a product (absent: exact)."""
    r = lambda name, x: R.get(name, lambda y: y)(x)
    NH = B * H
    S = np.zeros((NH, D, D))
    saved = []
    for c in range(N):
        sl = slice(c * C, (c + 1) * C)
        G = np.cumsum(g[:, sl], axis=1)
        gam = np.exp(G)
        Dm = np.tril(np.exp(G[:, :, None] - G[:, None, :]))
        kc, vc, bc = k[:, sl], v[:, sl], beta[:, sl]
        A = np.eye(C) + np.tril(bc[:, :, None] * np.einsum("nid,njd->nij", kc, kc) * Dm, -1)
        T = np.linalg.inv(A)
        W = r("W", T @ ((bc * gam)[:, :, None] * kc))
        U = r("U", T @ (bc[:, :, None] * vc))
        Vbar = U - np.einsum("nid,nvd->niv", W, r("S", S))
        saved.append((S.copy(), T, W, Vbar, G))
        lam = np.exp(G[:, -1:] - G)
        S = gam[:, -1, None, None] * S + np.einsum("niv,nid->nvd", r("Vbar_update", lam[:, :, None] * Vbar), kc)
    dS = np.zeros((NH, D, D))
    dq, dk, dv, db = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v), np.zeros_like(beta)
    for c in reversed(range(N)):
        sl = slice(c * C, (c + 1) * C)
        kc, qc, vc, bc, doc = k[:, sl], q[:, sl], v[:, sl], beta[:, sl], do[:, sl]
        S_, T, W, Vbar, G = saved[c]
        gam, lam = np.exp(G), np.exp(G[:, -1:] - G)
        Dm = np.tril(np.exp(G[:, :, None] - G[:, None, :]))
        P = np.einsum("nid,njd->nij", qc, kc) * Dm
        Gp = dS
        # the reverse scan
        dVb = np.einsum("nij,niv->njv", r("P", P), doc) + lam[:, :, None] * np.einsum("nid,nvd->niv", kc, r("G'", Gp))
        dS = (gam[:, -1, None, None] * Gp + np.einsum("niv,nid->nvd", doc, r("gamma Q", gam[:, :, None] * qc))
              - np.einsum("niv,nid->nvd", r("dVbar_update", dVb), r("W_update", W)))
        # the chunk gradients
        Sr, Gpr, Vbr, dVbr = r("S2", S_), r("G'2", Gp), r("Vbar2", Vbar), r("dVbar2", dVb)
        dW = -np.einsum("niv,nvd->nid", dVbr, Sr)
        Eo = r("E_o", np.einsum("niv,njv->nij", doc, Vbr) * Dm)
        dqc = gam[:, :, None] * np.einsum("niv,nvd->nid", doc, Sr) + np.einsum("nij,njd->nid", Eo, kc)
        dkc = np.einsum("nij,nid->njd", Eo, qc) + lam[:, :, None] * np.einsum("niv,nvd->nid", Vbr, Gpr)
        bg = bc * gam
        Tr, dWr = r("T", T), r("dW", dW)
        dT = r("dT", np.einsum("niv,njv->nij", r("dVbar2", dVb), r("beta V", bc[:, :, None] * vc))
               + np.einsum("nid,njd->nij", dWr, r("beta gamma K", bg[:, :, None] * kc)))
        E = np.tril(-np.einsum("nji,njk,nlk->nil", Tr, dT, Tr), -1)
        TdW, TdU = np.einsum("nji,njd->nid", Tr, dWr), np.einsum("nji,njv->niv", Tr, dVbr)
        F = r("F", bc[:, :, None] * (E * Dm))
        dkc += bg[:, :, None] * TdW + np.einsum("nij,njd->nid", F + np.transpose(F, (0, 2, 1)), kc)
        dq[:, sl], dk[:, sl], dv[:, sl] = dqc, dkc, bc[:, :, None] * TdU
        db[:, sl] = (TdU * vc).sum(-1) + gam * (TdW * kc).sum(-1) + (E * Dm * np.einsum("nid,njd->nij", kc, kc)).sum(-1)
    return dq, dk, dv, db


reference = run({})


def report(name, R):
    out = run(R)
    errors = " ".join(f"{n}={np.linalg.norm(bf16(o) - r_) / np.linalg.norm(r_):.3e}"
                      for n, o, r_ in zip(["dq", "dk", "dv", "dbeta"], out, reference))
    print(f"{name:62s} {errors}", flush=True)


everything = ["W", "U", "S", "Vbar_update", "P", "G'", "gamma Q", "dVbar_update", "W_update", "S2", "G'2", "Vbar2",
              "dVbar2", "E_o", "T", "dW", "dT", "F", "beta V", "beta gamma K"]
v2 = {n: bf16 for n in everything}
v2.update({n: pair for n in ["W", "U", "S", "Vbar_update", "P", "G'", "S2", "G'2", "Vbar2", "dVbar2"]})
v3 = dict(v2)
v3.update({"S2": bf16, "G'2": bf16})
v3_all_single = dict(v3)
v3_all_single.update({"Vbar2": bf16, "dVbar2": bf16})
reused_forward = {n: pair for n in everything}
reused_forward.update({"W": bf16, "U": bf16, "Vbar_update": bf16})
print("Gated DeltaNet" if gated else "DeltaNet", f"(bf16, B={B}, H={H}, L={L}, D={D}, C={C}): relative L2 vs float64")
report("exact, then the stored bf16 rounding only", {})
report("every intermediate one bf16 rounding", {n: bf16 for n in everything})
report("the forward's bf16 W, U reused, the backward all pairs", reused_forward)
report("v2: the pairs and single roundings chosen first", v2)
report("v3: v2 with S_[c], G' rounded once in the chunk gradients", v3)
report("v3 with V̄, dV̄ also rounded once there", v3_all_single)
