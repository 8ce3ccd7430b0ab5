"""The oracle's own forms wrapped as a kernel (dict in, dict out), for check_kernel's self-check and
as a readable model of what a kernel must return. Each (sequence, head) is one call of a form in
deltaproof.linear_attention / delta_rule / gated_delta_rule; nothing is re-implemented here except
the layout, varlen splitting, `scale` and the optional L2 normalisation of q and k."""
import numpy as np

from . import delta_rule, gated_delta_rule, linear_attention


L2NORM_EPS = 1e-6  # fla's l2norm: x / sqrt(‖x‖² + 1e-6)


def _l2norm_forward(x):
    inv = 1 / np.sqrt((x * x).sum(-1, keepdims=True) + L2NORM_EPS)
    return x * inv, inv


def _l2norm_backward(x, inv, grad):
    """dx for y = x·r, r = (‖x‖² + eps)^(-1/2):  r·dy − r³ x (x·dy)."""
    return inv * grad - inv ** 3 * x * (x * grad).sum(-1, keepdims=True)


def reference_kernel(form="chunkwise", solve="forward_substitution", scalar="double"):
    """A kernel made of the oracle's `form` ("chunkwise", "recurrent", "parallel") in `scalar`
    ("double" or "high"): takes check_kernel's input dict, returns o, ht and gradients."""

    def kernel(args):
        op, layout, C = args["op"], args["layout"], int(args.get("chunk_size", 64))
        cu = args.get("cu_seqlens")
        varlen = cu is not None
        scale = args.get("scale", 1.0)
        l2 = bool(args.get("qk_l2norm", False))
        f64 = {k: (np.asarray(v, dtype=np.float64) if isinstance(v, np.ndarray) and k != "cu_seqlens" else v)
               for k, v in args.items()}
        q_all, k_all, v_all = f64["q"], f64["k"], f64["v"]
        bhld = layout == "bhld"
        H = q_all.shape[1] if bhld else q_all.shape[2]
        out = {"o": np.zeros(v_all.shape), "ht": None}
        grads = "do" in f64
        if grads:
            out.update(dq=np.zeros(q_all.shape), dk=np.zeros(k_all.shape), dv=np.zeros(v_all.shape))
            if op != "linear":
                out["dbeta"] = np.zeros(f64["beta"].shape)
            if op == "gated-delta":
                out["dg"] = np.zeros(f64["g"].shape)
        N = len(cu) - 1 if varlen else q_all.shape[0]
        K, V = q_all.shape[-1], v_all.shape[-1]
        scale = K ** -0.5 if scale is None else float(scale)  # None: fla's default
        state_shape = (N, H, V, K) if bhld else (N, H, K, V)
        out["ht"] = np.zeros(state_shape)
        if grads and "h0" in f64:
            out["dh0"] = np.zeros(state_shape)

        def tokens(name):
            x = f64[name]
            if bhld:  # -> [B, L, H, ...]
                x = np.swapaxes(x, 1, 2)
            return x

        def put(name, n, h, value):
            x = out[name]
            view = np.swapaxes(x, 1, 2) if bhld else x
            if varlen:
                view[0, cu[n]:cu[n + 1], h] = value
            else:
                view[n, :, h] = value

        def state_in(name, n, h):  # (DV, DK) value-by-key
            s = f64[name][n, h]
            return s if bhld else s.T

        def state_out(name, n, h, s):
            out[name][n, h] = s if bhld else s.T

        for n in range(N):
            for h in range(H):
                def seq(name):
                    x = tokens(name)
                    return x[0, cu[n]:cu[n + 1], h] if varlen else x[n, :, h]

                q_raw, k_raw, v = seq("q"), seq("k"), seq("v")
                if l2:
                    q_n, q_inv = _l2norm_forward(q_raw)
                    k, k_inv = _l2norm_forward(k_raw)
                else:
                    q_n, k = q_raw, k_raw
                q = scale * q_n
                h0 = state_in("h0", n, h) if "h0" in f64 else None
                if op == "linear":
                    r = _la_forward(form, q, k, v, h0, C, scalar)
                elif op == "delta":
                    r = _delta_forward(form, q, k, v, seq("beta"), h0, C, solve, scalar)
                else:
                    r = gated_delta_rule.chunkwise_log_gate(q, k, v, seq("beta"), seq("g"), C if form == "chunkwise"
                                                            else max(1, len(q)), h0, solve, scalar=scalar)
                put("o", n, h, r.o)
                state_out("ht", n, h, r.ht)
                if not grads:
                    continue
                do = seq("do")
                dht = state_in("dht", n, h) if "dht" in f64 else None
                if op == "linear":
                    g = _la_backward(form, q, k, v, do, h0, dht, C, scalar)
                elif op == "delta":
                    g = _delta_backward(form, q, k, v, seq("beta"), do, h0, dht, C, solve, scalar)
                else:
                    g = gated_delta_rule.chunkwise_log_gate_backward(
                        q, k, v, seq("beta"), seq("g"), do, C if form == "chunkwise" else max(1, len(q)), h0, dht,
                        solve, scalar=scalar)
                dq, dk = scale * g.dq, g.dk
                if l2:
                    dq = _l2norm_backward(q_raw, q_inv, dq)
                    dk = _l2norm_backward(k_raw, k_inv, dk)
                put("dq", n, h, dq)
                put("dk", n, h, dk)
                put("dv", n, h, g.dv)
                if op != "linear":
                    put("dbeta", n, h, g.dbeta)
                if op == "gated-delta":
                    put("dg", n, h, g.dg)
                if "dh0" in out:
                    state_out("dh0", n, h, g.dh0)
        return out

    kernel.__name__ = f"reference_kernel[{form},{scalar}]"
    return kernel


def _la_forward(form, q, k, v, h0, C, scalar):
    if form == "chunkwise":
        return linear_attention.chunkwise(q, k, v, C, h0, scalar)
    return linear_attention.FORMS[form](q, k, v, h0, scalar)


def _la_backward(form, q, k, v, do, h0, dht, C, scalar):
    if form == "chunkwise":
        return linear_attention.chunkwise_backward(q, k, v, do, C, h0, dht, scalar)
    return linear_attention.BACKWARD[form](q, k, v, do, h0, dht, scalar)


def _delta_forward(form, q, k, v, beta, h0, C, solve, scalar):
    if form == "chunkwise":
        return delta_rule.chunkwise(q, k, v, beta, C, h0, solve, scalar=scalar)
    if form == "parallel":
        return delta_rule.parallel(q, k, v, beta, h0, solve, scalar=scalar)
    return delta_rule.recurrent(q, k, v, beta, h0, scalar)


def _delta_backward(form, q, k, v, beta, do, h0, dht, C, solve, scalar):
    if form == "chunkwise":
        return delta_rule.chunkwise_backward(q, k, v, beta, do, C, h0, dht, solve, scalar=scalar)
    if form == "parallel":
        return delta_rule.parallel_backward(q, k, v, beta, do, h0, dht, solve, scalar=scalar)
    return delta_rule.recurrent_backward(q, k, v, beta, do, h0, dht, scalar)
