"""torch_kernel: a PyTorch forward function (fla style) as a check_kernel kernel.

torch is imported lazily: the rest of deltaproof never needs it.
"""
import numpy as np

_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


def torch_kernel(forward_fn, device="cuda", name=None, state_dtype="fp32", gate_dtype="fp32"):
    """Wraps ``forward_fn`` into check_kernel's dict-in/dict-out kernel.

    forward_fn(q, k, v, beta=None, g=None, initial_state=None, cu_seqlens=None, scale=..., chunk_size=...,
    qk_l2norm=...) -> (o, ht), with torch tensors in the case's layout (fla: [B, T, H, D]). The adapter
    passes only the keyword arguments that apply (beta for delta ops, g for gated-delta, cu_seqlens
    when varlen; scale, chunk_size, qk_l2norm always, scale=None where a case asks for the
    function's own default), converts every input exactly (bf16 values as torch.bfloat16; g and
    states in fp32), and, when the inputs hold ``do`` (and ``dht``), computes
    dq, dk, dv, dbeta, dg, dh0 by autograd with those cotangents. Outputs come back as float64 numpy
    arrays holding the kernel's values exactly.
    """
    import torch  # optional dependency: only this adapter needs it

    def tensor(x, dtype_name, grad):
        t = torch.from_numpy(np.ascontiguousarray(np.asarray(x, dtype=np.float64)))
        t = t.to(device=device, dtype=getattr(torch, _TORCH_DTYPES[dtype_name]))
        return t.requires_grad_(grad)

    def kernel(args):
        dtype = args["dtype"]
        backward = "do" in args
        names = ["q", "k", "v"] + [n for n in ("beta", "g", "h0") if n in args and args[n] is not None]
        dtypes = {n: (gate_dtype if n == "g" else state_dtype if n == "h0" else dtype) for n in names}
        inputs = {n: tensor(args[n], dtypes[n], backward) for n in names}
        scale = args.get("scale", 1.0)  # None: the function's own default (fla's K^-1/2)
        kwargs = {"scale": None if scale is None else float(scale), "chunk_size": int(args.get("chunk_size", 64)),
                  "qk_l2norm": bool(args.get("qk_l2norm", False))}
        if args.get("cu_seqlens") is not None:
            kwargs["cu_seqlens"] = torch.as_tensor(np.asarray(args["cu_seqlens"]), dtype=torch.long, device=device)
        for n in ("beta", "g"):
            if n in inputs:
                kwargs[n] = inputs[n]
        if "h0" in inputs:
            kwargs["initial_state"] = inputs["h0"]
        o, ht = forward_fn(inputs["q"], inputs["k"], inputs["v"], **kwargs)
        out = {"o": o, "ht": ht}
        if backward:
            targets, cotangents = [o], [tensor(args["do"], dtype, False).to(o.dtype)]
            if args.get("dht") is not None and ht is not None:
                targets.append(ht)
                cotangents.append(tensor(args["dht"], state_dtype, False).to(ht.dtype))
            wrt = [inputs[n] for n in names]
            grads = torch.autograd.grad(targets, wrt, cotangents, allow_unused=True)
            for n, g in zip(names, grads):
                out["d" + n] = g
        torch.cuda.synchronize() if str(device).startswith("cuda") else None
        return {k: (None if v is None else v.detach().to("cpu", torch.float64).numpy()) for k, v in out.items()}

    kernel.__name__ = name or getattr(forward_fn, "__name__", "torch_kernel")
    return kernel
