"""A chunkwise kernel written in numpy float32 (fla's layout, varlen, all three ops), faithful by
default; planted bugs are policies that override one of its choices (`Faithful`'s methods), for the
tests that check check_kernel catches them.

Like a GPU kernel it multiplies the dtype-rounded inputs in float32, keeps the state in float32
(fla's fp32 h0/ht) and rounds o to the input dtype. It takes scale=None as fla does (K^-1/2).
Forward only; `planted_kernels.with_oracle_gradients` adds gradients.
"""
import numpy as np

from deltaproof.dtypes import round_to, round_to_bf16

f32 = np.float32


class Faithful:
    """The kernel's choices, one method each. A planted bug is a subclass overriding one."""
    name = "faithful"

    def scale(self, given, key_dim, value_dim):
        return key_dim ** -0.5 if given is None else given                  # fla: K^-1/2 by default

    def scaled(self, q, k, scale):
        """(q, k) as the chunk products use them."""
        return q * f32(scale), k

    def initial_state(self, h0, n, h, dtype):
        """(DV, DK) state of sequence n, head h from h0 [N, H, DK, DV]."""
        return h0[n, h].T.copy()

    def use_h0(self):
        return True

    def sequence_gates(self, gates):
        return gates

    def cumulative_gates(self, g, chunk_size):
        return np.cumsum(g, dtype=f32)                                       # G_r of one chunk

    def mask(self, n):
        i, j = np.indices((n, n))
        return j <= i

    def keep_chunk(self, tokens, chunk_size):
        return True

    def carry_between_sequences(self):
        return False

    def state_after_chunk(self, state, dtype):
        return state


class MaskOffByOne(Faithful):
    name = "mask_off_by_one"

    def mask(self, n):
        i, j = np.indices((n, n))
        return j < i                                                         # the diagonal dropped


class DropPartialChunk(Faithful):
    name = "drop_partial_chunk"

    def keep_chunk(self, tokens, chunk_size):
        return tokens == chunk_size                                          # a short last chunk skipped


class LoseH0(Faithful):
    name = "lose_h0"

    def use_h0(self):
        return False


class NoVarlenReset(Faithful):
    name = "no_varlen_reset"

    def carry_between_sequences(self):
        return True                                                          # sequence n starts from n−1's state


class GateWrongToken(Faithful):
    name = "gate_wrong_token"

    def sequence_gates(self, gates):
        return np.roll(gates, 1) if len(gates) > 1 else gates                # token t decays with g_{t−1}


class Bf16State(Faithful):
    name = "bf16_state"

    def state_after_chunk(self, state, dtype):
        return round_to_bf16(state)                                          # in every dtype, fp32 included


POLICIES = {p.name: p for p in (MaskOffByOne, DropPartialChunk, LoseH0, NoVarlenReset, GateWrongToken, Bf16State)}
BUGS = tuple(POLICIES)


def chunk_step(policy, op, q, k, v, beta, g, state, mask, chunk_size):
    """One chunk: (o (C, DV), new state (DV, DK)) in float32."""
    n = q.shape[0]
    if op == "gated-delta":
        G = policy.cumulative_gates(g, chunk_size)                         # G_r, (C,)
        gamma = np.exp(G).astype(f32)                                      # γ_r
        D = np.exp(np.where(mask, G[:, None] - G[None, :], -np.inf)).astype(f32)  # D_ri = exp(G_r − G_i), 0 above
        lam = np.exp(G[-1] - G).astype(f32)                                # λ_i
        end = np.exp(G[-1]).astype(f32)
    else:
        gamma, D, lam, end = np.ones(n, f32), mask.astype(f32), np.ones(n, f32), f32(1)
    if op == "linear":
        v_new = v
    else:
        A = np.eye(n, dtype=f32) + np.tril((beta[:, None] * (k @ k.T)) * D, -1)
        T = np.eye(n, dtype=f32)                                           # A⁻¹ by forward substitution
        for i in range(n):
            for j in range(i):
                T[i, j] = -(A[i, j:i] @ T[j:i, j])
        W = T @ ((beta * gamma)[:, None] * k)
        U = T @ (beta[:, None] * v)
        v_new = U - W @ state.T
    o = gamma[:, None] * (q @ state.T) + ((q @ k.T) * D) @ v_new
    state = end * state + v_new.T @ (lam[:, None] * k)
    return o.astype(f32), state.astype(f32)


def policy_kernel(policy):
    """check_kernel's kernel (dict in, dict with o and ht out; layout blhd) following `policy`."""

    def kernel(args):
        with np.errstate(over="ignore", invalid="ignore"):  # a planted bug may overflow: judged as non-finite
            return run(args)

    def run(args):
        op, C, dtype = args["op"], int(args["chunk_size"]), args["dtype"]
        assert args["layout"] == "blhd"
        B, T, H, K = args["q"].shape
        V = args["v"].shape[-1]
        q, k = policy.scaled(np.asarray(args["q"], f32), np.asarray(args["k"], f32),
                             policy.scale(args.get("scale", 1.0), K, V))
        v = np.asarray(args["v"], f32)
        beta = np.asarray(args["beta"], f32) if "beta" in args else None
        g = np.asarray(args["g"], f32) if "g" in args else None
        h0 = np.asarray(args["h0"], f32) if "h0" in args and args["h0"] is not None else None
        cu = args.get("cu_seqlens")
        spans = ([(0, int(cu[n]), int(cu[n + 1])) for n in range(len(cu) - 1)] if cu is not None
                 else [(b, 0, T) for b in range(B)])
        o = np.zeros((B, T, H, V), f32)
        ht = np.zeros((len(spans), H, K, V), f32)
        for h in range(H):
            carried = None
            for n, (b, start, stop) in enumerate(spans):
                if h0 is not None and policy.use_h0():
                    state = policy.initial_state(h0, n, h, dtype)                # (DV, DK)
                else:
                    state = np.zeros((V, K), f32)
                if policy.carry_between_sequences() and carried is not None:
                    state = carried
                gates = None if g is None else policy.sequence_gates(g[b, start:stop, h])
                for c0 in range(start, stop, C):
                    c1 = min(c0 + C, stop)
                    if not policy.keep_chunk(c1 - c0, C):
                        continue
                    out, state = chunk_step(policy, op, q[b, c0:c1, h], k[b, c0:c1, h], v[b, c0:c1, h],
                                            None if beta is None else beta[b, c0:c1, h],
                                            None if gates is None else gates[c0 - start:c1 - start], state,
                                            policy.mask(c1 - c0), C)
                    state = policy.state_after_chunk(state, dtype)
                    o[b, c0:c1, h] = out
                ht[n, h] = state.T
                carried = state
        return {"o": np.asarray(round_to(o, dtype), np.float64), "ht": ht}

    kernel.__name__ = f"numpy_kernel[{policy.name}]"
    return kernel


def numpy_kernel(bug=None):
    """The faithful kernel, or the one with a named bug of BUGS planted."""
    if bug is not None and bug not in POLICIES:
        raise ValueError(f"bug: expected None or one of {BUGS} (got {bug!r})")
    return policy_kernel(POLICIES[bug]() if bug else Faithful())
